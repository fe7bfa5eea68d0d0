"""Check the installed torchcomms against the reference's public API sheet.

Every name of the sheet (../shared/REFERENCE_API.md, kept in SHEET below) is looked up;
where the sheet gives parameters, the signature is compared (names in order). A name is
"same" when found with the sheet's parameters, "differs" when found with others or with a
documented difference, and "missing" when absent.

    python scripts/reference_api_check.py            # the table and the counts (names,
                                                     # then the reference's hint keys)
    python scripts/reference_api_check.py --counts   # only the counts
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from typing import Any

A = ["async_op", "hints", "timeout"]

# (where, name, parameters or None). "where" is a module or "TorchComm" etc.
SHEET: list[tuple[str, str, list[str] | None]] = [
    # 1. top level
    (
        "torchcomms",
        "new_comm",
        [
            "backend",
            "device",
            "name",
            "abort_process_on_timeout_or_error",
            "timeout",
            "is_high_priority_stream",
            "store",
            "enable_reconfigure",
            "hints",
        ],
    ),
    ("torchcomms", "TorchComm", None),
    ("torchcomms", "ReduceOp", None),
    ("torchcomms", "TorchWork", None),
    ("torchcomms", "Timeout", None),
    ("torchcomms", "BatchP2POptions", None),
    ("torchcomms", "BatchSendRecv", None),
    ("torchcomms", "P2POp", None),
    ("torchcomms", "CommOptions", None),
    ("torchcomms", "TorchCommWindow", None),
    ("torchcomms", "register_backend", ["name", "backend_class"]),
    ("torchcomms", "TorchCommBackend", None),
    ("torchcomms", "RedOpType", None),
    ("torchcomms", "OpName", None),
    ("torchcomms", "RemovableHandle", None),
    ("torchcomms", "WorkStatus", None),
    ("torchcomms", "TorchCommWinAccessType", None),
    ("torchcomms", "TorchCommWindowAttr", None),
    ("torchcomms", "P2POpType", None),
    ("torchcomms", "ReconfigureOptions", None),
    ("torchcomms", "WorkWrapper", None),
    ("torchcomms", "get_mem_allocator", ["backend"]),
    ("torchcomms", "is_backend_built", ["backend"]),
    ("torchcomms", "built_backends", []),
    ("torchcomms", "_load_backend", ["backend"]),
    ("torchcomms", "is_torch_compile_supported", ["min_version", "_current_version"]),
    ("torchcomms", "is_torch_compile_supported_and_enabled", ["min_version", "_current_version"]),
    ("torchcomms", "InitHandle", None),
    ("torchcomms._comms", "_is_backend_registered", ["name"]),
    ("torchcomms._comms", "_BackendWrapper", None),
    ("torchcomms._comms", "_BackendWrapperOptions", None),
    ("torchcomms._comms", "TorchCommBackend", None),
    ("torchcomms", "hooks", None),
    ("torchcomms", "objcol", None),
    # 2. TorchComm methods
    ("TorchComm", "send", ["tensor", "dst", *A]),
    ("TorchComm", "recv", ["tensor", "src", *A]),
    ("TorchComm", "broadcast", ["tensor", "root", *A]),
    ("TorchComm", "all_reduce", ["tensor", "op", *A]),
    ("TorchComm", "reduce", ["tensor", "root", "op", *A]),
    ("TorchComm", "all_gather", ["tensor_list", "tensor", *A]),
    ("TorchComm", "all_gather_v", ["tensor_list", "tensor", *A]),
    ("TorchComm", "all_gather_single", ["output", "input", *A]),
    ("TorchComm", "reduce_scatter", ["output", "input_list", "op", *A]),
    ("TorchComm", "reduce_scatter_v", ["output", "input_list", "op", *A]),
    ("TorchComm", "reduce_scatter_single", ["output", "input", "op", *A]),
    ("TorchComm", "all_to_all_single", ["output", "input", *A]),
    (
        "TorchComm",
        "all_to_all_v_single",
        ["output", "input", "output_split_sizes", "input_split_sizes", *A],
    ),
    ("TorchComm", "all_to_all", ["output_tensor_list", "input_tensor_list", *A]),
    ("TorchComm", "barrier", A),
    ("TorchComm", "scatter", ["output_tensor", "input_tensor_list", "root", *A]),
    ("TorchComm", "gather", ["output_tensor_list", "input_tensor", "root", *A]),
    ("TorchComm", "gather_single", ["output", "input", "root", *A]),
    ("TorchComm", "all_gather_p_init", ["output", "hints", "timeout"]),
    ("TorchComm", "all_gather_p_exec", ["handle", "input", *A]),
    ("TorchComm", "all_gather_p_free", ["handle"]),
    ("TorchComm", "split", ["ranks", "name", "hints", "timeout"]),
    ("TorchComm", "batch_op_create", []),
    ("TorchComm", "new_window", ["tensor"]),
    ("TorchComm", "get_init_handle", []),
    ("TorchComm", "reconfigure", ["uuid", "init_handles", "timeout", "hints"]),
    ("TorchComm", "abort", []),
    ("TorchComm", "is_aborted", []),
    ("TorchComm", "is_abort_supported", []),
    ("TorchComm", "finalize", []),
    ("TorchComm", "set_timeout", ["timeout"]),
    ("TorchComm", "set_hints", ["hints"]),
    ("TorchComm", "get_rank", []),
    ("TorchComm", "get_size", []),
    ("TorchComm", "get_name", []),
    ("TorchComm", "get_options", []),
    ("TorchComm", "get_device", []),
    ("TorchComm", "get_backend", []),
    ("TorchComm", "get_backend_version", []),
    ("TorchComm", "get_backend_impl", []),
    ("TorchComm", "unsafe_get_backend", []),
    ("TorchComm", "get_device_transport", []),
    ("TorchComm", "get_mem_allocator", []),
    ("TorchComm", "mem_allocator", None),
    ("TorchComm", "tensor_register", ["tensor"]),
    ("TorchComm", "tensor_deregister", ["tensor"]),
    ("TorchComm", "register_pre_hook", ["callback"]),
    ("TorchComm", "register_post_hook", ["callback"]),
    ("TorchComm", "register_abort_hook", ["callback"]),
    ("TorchComm", "__copy__", []),
    ("TorchComm", "__deepcopy__", ["memo"]),
    # 3. work, p2p, options
    ("TorchWork", "is_completed", []),
    ("TorchWork", "wait", []),
    ("TorchWork", "wait_blocking", []),
    ("TorchWork", "_set_status", ["status"]),
    ("WorkStatus", "NOT_STARTED", None),
    ("WorkStatus", "INPROGRESS", None),
    ("WorkStatus", "COMPLETED", None),
    ("WorkStatus", "TIMEDOUT", None),
    ("WorkStatus", "ERROR", None),
    ("P2POpType", "SEND", None),
    ("P2POpType", "RECV", None),
    ("P2POp", "__init__", ["type", "tensor", "peer"]),
    ("BatchSendRecv", "send", ["tensor", "dst"]),
    ("BatchSendRecv", "recv", ["tensor", "src"]),
    ("BatchSendRecv", "issue", ["async_op", "options"]),
    ("BatchP2POptions", "__init__", []),
    ("CommOptions", "__init__", None),
    ("ReconfigureOptions", "__init__", ["uuid", "init_handles", "timeout", "hints"]),
    *[
        ("torchcomms", f"{x}Options", None)
        for x in (
            "Send",
            "Recv",
            "Broadcast",
            "AllReduce",
            "Reduce",
            "AllGather",
            "AllGatherSingle",
            "ReduceScatter",
            "ReduceScatterSingle",
            "AllToAll",
            "AllToAllSingle",
            "AllToAllvSingle",
            "Barrier",
            "Scatter",
            "Gather",
            "AllGatherPInit",
            "AllGatherPExec",
        )
    ],
    ("ReduceOp", "__init__", ["opType"]),
    ("ReduceOp", "PREMUL_SUM", ["factor"]),
    ("ReduceOp", "type", None),
    # 4. hook arguments
    *[
        ("torchcomms", f"{x}PreHookArgs", None)
        for x in (
            "Send",
            "Recv",
            "Broadcast",
            "Reduce",
            "AllReduce",
            "AllGather",
            "AllGatherV",
            "AllGatherSingle",
            "ReduceScatterSingle",
            "AllToAllSingle",
            "ReduceScatter",
            "ReduceScatterV",
            "AllToAllVSingle",
            "AllToAll",
            "Barrier",
            "Scatter",
            "Gather",
            "GatherSingle",
            "Split",
            "BatchOpIssue",
            "NewWindow",
            "Finalize",
        )
    ],
    *[
        ("torchcomms", f"{x}PostHookArgs", None)
        for x in ("Split", "NewWindow", "BatchOpIssue", "Finalize", "Collective")
    ],
    # 5. windows
    ("TorchCommWindow", "tensor_register", ["tensor", "owning"]),
    ("TorchCommWindow", "tensor_deregister", []),
    ("TorchCommWindow", "get_size", []),
    ("TorchCommWindow", "get_tensor", []),
    ("TorchCommWindow", "put", ["tensor", "dst_rank", "target_offset_nelems", *A]),
    ("TorchCommWindow", "signal", ["peer_rank", *A]),
    ("TorchCommWindow", "wait_signal", ["peer_rank", *A]),
    ("TorchCommWindow", "get_attr", ["peer_rank"]),
    ("TorchCommWindow", "map_remote_tensor", ["rank"]),
    ("TorchCommWindow", "get_device_window", ["signal_count", "counter_count", "barrier_count"]),
    ("TorchCommWindow", "register_local_buffer", ["tensor"]),
    ("TorchCommWindow", "deregister_local_buffer", ["handle"]),
    # 7. functional
    (
        "torchcomms.functional",
        "is_torch_compile_supported_and_enabled",
        ["min_version", "_current_version"],
    ),
    ("torchcomms.functional", "MIN_PYTORCH_VERSION_FOR_COMPILE", None),
    # 8. device mesh
    (
        "torchcomms.device_mesh",
        "init_device_mesh",
        ["mesh_dim_comms", "mesh_dim_names", "_global_comm"],
    ),
    (
        "torchcomms.device_mesh",
        "_create_torchcomm_process_group",
        ["comm", "group_name", "backend_str", "global_ranks_mapping"],
    ),
    (
        "torchcomms.device_mesh",
        "_flatten_with_comm",
        ["mesh", "mesh_dim_name", "comm", "global_ranks", "layout"],
    ),
    # 9. objcol
    (
        "torchcomms.objcol",
        "all_gather_object",
        ["comm", "object_list", "obj", "timeout", "weights_only"],
    ),
    (
        "torchcomms.objcol",
        "gather_object",
        ["comm", "obj", "root", "object_gather_list", "timeout", "weights_only"],
    ),
    ("torchcomms.objcol", "send_object_list", ["comm", "object_list", "dst", "timeout"]),
    (
        "torchcomms.objcol",
        "recv_object_list",
        ["comm", "object_list", "src", "timeout", "weights_only"],
    ),
    (
        "torchcomms.objcol",
        "broadcast_object_list",
        ["comm", "object_list", "root", "timeout", "weights_only"],
    ),
    (
        "torchcomms.objcol",
        "scatter_object_list",
        [
            "comm",
            "root",
            "scatter_object_output_list",
            "scatter_object_input_list",
            "timeout",
            "weights_only",
        ],
    ),
    # 10. hooks
    ("torchcomms.hooks", "FlightRecorderHook", None),
    ("torchcomms.hooks", "NanCheckHook", None),
    ("torchcomms.hooks", "clog", None),
    # 11. distwrap
    (
        "torchcomms.distwrap",
        "init_process_group",
        [
            "backend",
            "init_method",
            "timeout",
            "world_size",
            "rank",
            "store",
            "group_name",
            "pg_options",
            "device_id",
            "use_torchcomms",
        ],
    ),
    ("torchcomms.distwrap", "destroy_process_group", ["group"]),
    (
        "torchcomms.distwrap",
        "new_group",
        [
            "ranks",
            "timeout",
            "backend",
            "pg_options",
            "use_local_synchronization",
            "group_desc",
            "device_id",
        ],
    ),
    (
        "torchcomms.distwrap",
        "split_group",
        ["parent_pg", "split_ranks", "timeout", "pg_options", "group_desc", "backend"],
    ),
    ("torchcomms.distwrap", "all_reduce", ["tensor", "op", "group", "async_op"]),
    ("torchcomms.distwrap", "broadcast", ["tensor", "src", "group", "async_op", "group_src"]),
    (
        "torchcomms.distwrap",
        "reduce",
        ["tensor", "dst", "op", "group", "async_op", "group_dst"],
    ),
    ("torchcomms.distwrap", "all_gather", ["tensor_list", "tensor", "group", "async_op"]),
    (
        "torchcomms.distwrap",
        "all_gather_into_tensor",
        ["output_tensor", "input_tensor", "group", "async_op"],
    ),
    (
        "torchcomms.distwrap",
        "reduce_scatter",
        ["output", "input_list", "op", "group", "async_op"],
    ),
    (
        "torchcomms.distwrap",
        "reduce_scatter_tensor",
        ["output", "input", "op", "group", "async_op"],
    ),
    (
        "torchcomms.distwrap",
        "all_to_all",
        ["output_tensor_list", "input_tensor_list", "group", "async_op"],
    ),
    (
        "torchcomms.distwrap",
        "all_to_all_single",
        ["output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op"],
    ),
    (
        "torchcomms.distwrap",
        "scatter",
        ["tensor", "scatter_list", "src", "group", "async_op", "group_src"],
    ),
    (
        "torchcomms.distwrap",
        "gather",
        ["tensor", "gather_list", "dst", "group", "async_op", "group_dst"],
    ),
    ("torchcomms.distwrap", "barrier", ["group", "async_op", "device_ids"]),
    ("torchcomms.distwrap", "send", ["tensor", "dst", "group", "tag", "group_dst"]),
    ("torchcomms.distwrap", "recv", ["tensor", "src", "group", "tag", "group_src"]),
    ("torchcomms.distwrap", "isend", ["tensor", "dst", "group", "tag", "group_dst"]),
    ("torchcomms.distwrap", "irecv", ["tensor", "src", "group", "tag", "group_src"]),
    ("torchcomms.distwrap", "batch_isend_irecv", ["p2p_op_list"]),
    ("torchcomms.distwrap", "P2POp", ["op", "tensor", "peer", "group", "tag", "group_peer"]),
    ("torchcomms.distwrap", "all_gather_object", ["object_list", "obj", "group"]),
    (
        "torchcomms.distwrap",
        "gather_object",
        ["obj", "object_gather_list", "dst", "group", "group_dst"],
    ),
    (
        "torchcomms.distwrap",
        "scatter_object_list",
        [
            "scatter_object_output_list",
            "scatter_object_input_list",
            "src",
            "group",
            "group_src",
        ],
    ),
    (
        "torchcomms.distwrap",
        "broadcast_object_list",
        ["object_list", "src", "group", "device", "group_src"],
    ),
    ("torchcomms.distwrap", "get_mem_allocator", ["group", "device"]),
    ("torchcomms.distwrap", "register_mem_pool", ["group", "device", "pool"]),
    ("torchcomms.distwrap", "_make_nccl_premul_sum", ["mul_factor"]),
    ("torchcomms.distwrap", "new_window", ["group", "backend"]),
    (
        "torchcomms.distwrap",
        "reduce_scatter_quantized",
        ["output", "input", "op", "seed", "group", "async_op"],
    ),
    *[
        ("torchcomms.distwrap", name, None)
        for name in (
            "ReduceOp",
            "get_rank",
            "get_world_size",
            "is_initialized",
            "is_available",
            "get_process_group_ranks",
            "ProcessGroup",
            "ProcessGroupGloo",
            "ProcessGroupNCCL",
            "GroupMember",
            "group",
            "Store",
            "HashStore",
            "Work",
        )
    ],
]

# The reference's hint keys, by backend ("ncclx::*": NCCLX's own hints; the ncclConfig_t
# field names: NCCL's config).
HINT_KEYS: dict[str, list[str]] = {
    "gloo": ["lazy", "persistent_store"],
    "ncclx": [
        "is_high_priority_stream",
        "max_event_pool_size",
        "garbage_collect_interval_ms",
        "enable_cuda_graph_support",
        "graph_timeout_check_interval_ms",
        "ncclx::*",
        "blocking",
        "cgaClusterSize",
        "cga_cluster_size",
        "minCTAs",
        "maxCTAs",
        "netName",
        "splitShare",
        "trafficClass",
        "commName",
        "collnetEnable",
        "CTAPolicy",
        "shrinkShare",
        "nvlsCTAs",
    ],
    "nccl": ["is_high_priority_stream", "max_event_pool_size"],
    "rccl": ["is_high_priority_stream", "max_event_pool_size"],
}


def check_hints() -> list[tuple[str, str, str]]:
    """Each reference hint key: read by the installed backend ("same") or not ("missing")."""
    from torchcomms_core.operations.hints import key_known
    from torchcomms_core.plugin_host.backends import get_backend_class

    rows = []
    for backend, keys in HINT_KEYS.items():
        try:
            declared = get_backend_class(backend).hint_keys
        except Exception as exc:  # backend not installed
            rows += [(f"hint {backend}:{k}", "missing", type(exc).__name__) for k in keys]
            continue
        for key in keys:
            probe = key.replace("*", "cgaClusterSize")
            known = declared is not None and key_known(probe, declared)
            rows.append((f"hint {backend}:{key}", "same" if known else "missing", ""))
    return rows


def _resolve(where: str, name: str) -> Any:
    if where.startswith("torchcomms"):
        module = importlib.import_module(where)
        return getattr(module, name)
    import torchcomms

    owner = getattr(torchcomms, where)
    return inspect.getattr_static(owner, name)


def _params(obj: Any) -> list[str] | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [
        p
        for p in sig.parameters
        if p not in ("self", "cls")
        and sig.parameters[p].kind
        not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def check() -> list[tuple[str, str, str]]:
    rows = []
    for where, name, expected in SHEET:
        label = f"{where}.{name}"
        try:
            obj = _resolve(where, name)
        except (AttributeError, ImportError) as exc:
            rows.append((label, "missing", type(exc).__name__))
            continue
        if expected is None:
            rows.append((label, "same", ""))
            continue
        got = _params(obj)
        if got is None:
            rows.append((label, "same", "not introspectable"))
            continue
        keyword_only = {
            p
            for p, v in inspect.signature(
                obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
            ).parameters.items()
            if v.kind is inspect.Parameter.KEYWORD_ONLY
        }
        positional = [p for p in got if p not in keyword_only]
        if positional[: len(expected)] == expected:
            rows.append((label, "same", ""))
        else:
            rows.append((label, "differs", f"takes ({', '.join(got)})"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", action="store_true")
    args = parser.parse_args()
    rows = check() + check_hints()
    if not args.counts:
        for label, status, note in rows:
            print(f"{status:8} {label}  {note}")
    counts = {s: sum(1 for r in rows if r[1] == s) for s in ("same", "differs", "missing")}
    print(
        f"{len(rows)} sheet names: {counts['same']} same, {counts['differs']} differ, "
        f"{counts['missing']} missing"
    )


if __name__ == "__main__":
    main()
