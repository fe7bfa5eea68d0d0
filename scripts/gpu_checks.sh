#!/usr/bin/env bash
# GPU checks of the torchcomms GPU plugins, on a machine with an NVIDIA GPU.
#
# One GPU means NCCL runs at world size 1 only: NCCL refuses two ranks on one device.
# On such a machine these checks cover eager init, every collective's local path, the
# stream semantics (async_op=False must not block the host), split, abort, CUDA-graph
# capture, single-GPU bandwidth lines, the reference's NCCLX-only methods and
# reduce_scatter_quantized; they say nothing about cross-GPU transport.
#
# Usage:  bash scripts/gpu_checks.sh        (about 1-2 minutes on one H200; limit 5)
# Env:    PYTHON   interpreter to start from (default python3)
#         OUT      folder for the log (default docs/results/); the log is
#                  gpu-<date>-<device>.txt
#
# The python that already has torch with CUDA is used as it is (nothing is installed
# into it); otherwise a venv with system site packages gets torch==2.13.0 from PyPI.
# The core and the plugins are installed from the working tree in editable mode: with
# pip where hatchling is at hand, else (offline machines) by writing the same
# .dist-info entry-point metadata pip would, next to the source folders on PYTHONPATH.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/torchcomms-gpu.XXXXXX")"
export PYTHONUNBUFFERED=1

device_name() {
    local name
    name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
    name="$(printf '%s' "${name:-no-gpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-')"
    printf '%s' "${name%-}"
}

step() { printf '\n=== %s\n' "$*"; }

# Writes <dist>.dist-info (METADATA + entry_points.txt) for each pyproject under $2...
# into $1, so that importlib.metadata finds the entry points of source folders.
write_dist_info() {
    "$PY" - "$@" <<'EOF'
import os
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

site, projects = sys.argv[1], sys.argv[2:]
for project in projects:
    with open(os.path.join(project, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)["project"]
    name, version = meta["name"], meta["version"]
    info = os.path.join(site, f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, entries in meta.get("entry-points", {}).items():
            f.write(f"[{group}]\n")
            for key, value in entries.items():
                f.write(f"{key} = {value}\n")
            f.write("\n")
    print(f"  {name} {version} from {project}")
EOF
}

main() {
    set -euo pipefail  # a pipeline runs main in a subshell: keep it failing fast
    cd "$ROOT"
    step "device"
    if ! command -v nvidia-smi >/dev/null; then
        echo "nvidia-smi not found: run this on a machine with an NVIDIA GPU and driver" >&2
        return 1
    fi
    nvidia-smi -L

    step "python"
    if "$BASE_PY" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
        PY="$(command -v "$BASE_PY" || echo "$BASE_PY")"
        echo "using $PY: it has torch with CUDA"
    else
        echo "$BASE_PY has no torch with CUDA: creating a venv with torch==2.13.0"
        "$BASE_PY" -m venv --system-site-packages "$WORK/venv"
        PY="$WORK/venv/bin/python"
        "$PY" -m pip install -q torch==2.13.0 pluggy pytest hatchling
        "$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"'
    fi
    "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'

    step "install core and plugins from the working tree (editable)"
    local projects=(. plugins/torchcomms_gloo plugins/torchcomms_ncclx plugins/torchcomms_rccl
        plugins/torchcomms_quantized)
    if [[ "$PY" == "$WORK/venv/bin/python" ]]; then
        "$PY" -m pip install -q --no-deps --no-build-isolation \
            -e . -e plugins/torchcomms_gloo -e plugins/torchcomms_ncclx -e plugins/torchcomms_rccl \
            -e plugins/torchcomms_quantized
    else
        write_dist_info "$WORK/site" "${projects[@]}"
        export PYTHONPATH="$WORK/site:$ROOT/src:$ROOT/plugins/torchcomms_gloo/src:$ROOT/plugins/torchcomms_ncclx/src:$ROOT/plugins/torchcomms_rccl/src:$ROOT/plugins/torchcomms_quantized/src${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$PY" - <<'EOF'
import torchcomms
from torchcomms_core import registry

for name, entry in sorted(registry.entry_points().items()):
    ok, reason = torchcomms.get_backend_class(name).is_available()
    print(f"  {name:8} {entry.distribution} {entry.version}: {'runs here' if ok else reason}")
EOF

    step "quickstart on cuda:0 (torchrun, 1 process)"
    cat >"$WORK/quickstart_cuda.py" <<'EOF'
import torch
import torchcomms

comm = torchcomms.new_comm("ncclx", torch.device("cuda"), name="my_comm")
print(f"I am rank {comm.get_rank()} of {comm.get_size()} on "
      f"{comm.get_backend_impl().device}!")
t = torch.full((10, 20), fill_value=comm.get_rank() + 1, dtype=torch.float, device="cuda")
comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=False)
work = comm.all_reduce(t, torchcomms.ReduceOp.SUM, async_op=True)
work.wait()
n = comm.get_size()
expected = n * n * (n + 1) / 2
print(f"rank {comm.get_rank()}: after two all_reduce(SUM) every element is "
      f"{t[0, 0].item():g} (expected {expected:g})")
assert t[0, 0].item() == expected
comm.finalize()
EOF
    timeout 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
        "$WORK/quickstart_cuda.py"

    local gpu_tests=plugins/torchcomms_ncclx/tests/test_gpu_plugins.py
    step "pytest -m gpu $gpu_tests"
    timeout 180 "$PY" -m pytest -p no:cacheprovider -m gpu "$gpu_tests" -v -s

    # Part of the step above, shown apart: the reference's NCCLX-only methods (comm_dump,
    # comm_dump_all, get_nccl_comm_ptr, set_config, device_alltoallv_single) on a real
    # ProcessGroupNCCL, and reduce_scatter_quantized's CUDA rounding and ncclx run.
    step "NCCLX-only methods and reduce_scatter_quantized on cuda:0"
    timeout 120 "$PY" -m pytest -p no:cacheprovider -m gpu -v -s "$gpu_tests" -k "TestNcclxOnlyOnGPU or on_cuda" \
        plugins/torchcomms_quantized/tests/test_reduce_scatter_quantized.py

    step "the ncclx and rccl checks that need no GPU"
    timeout 60 "$PY" -m pytest -p no:cacheprovider -m "not gpu" "$gpu_tests" \
        plugins/torchcomms_ncclx/tests/test_ncclx_engine.py plugins/torchcomms_rccl/tests -q
}

LOG_DIR="${OUT:-$ROOT/docs/results}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu-$(date +%F)-$(device_name).txt"
set +e
main 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e
rm -rf "$WORK"
echo "log: $LOG (exit status $status)"
exit "$status"
