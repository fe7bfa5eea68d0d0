"""A transport write between two processes against a single-thread memcpy, interleaved.

Rank 0 alternates a ``torch`` copy of N bytes within its own memory (one thread) and an
``RdmaTransport.write`` of N bytes into rank 1's registered buffer, so both see the same
load on a shared machine and the ratio is read within one run:

    python benchmarks/transport_memcpy.py                 # 64 MiB, 20 pairs
    python benchmarks/transport_memcpy.py --mib 256 --pairs 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _swap(comm, payload: bytes) -> bytes:
    """The other rank's ``payload`` (two ranks), through the communicator."""
    lengths = torch.empty(2, dtype=torch.int64)
    comm.all_gather_single(lengths, torch.tensor([len(payload)], dtype=torch.int64))
    width = int(lengths.max())
    mine = torch.zeros(width, dtype=torch.uint8)
    mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    both = torch.empty(2 * width, dtype=torch.uint8)
    comm.all_gather_single(both, mine)
    other = 1 - comm.get_rank()
    return both[other * width : other * width + int(lengths[other])].numpy().tobytes()


def _rank_body(nbytes: int, pairs: int) -> dict[str, float] | None:
    import pickle

    import torchcomms
    from torchcomms._transport import RdmaMemory, RdmaTransport
    from torchcomms_core.testing import unique_name

    torch.set_num_threads(1)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("memcpy"))
    rank = comm.get_rank()
    transport = RdmaTransport(torch.device("cpu"))
    transport.connect(_swap(comm, transport.bind()))
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    dst.fill_(0)
    memory = RdmaMemory(src if rank == 0 else dst)
    remote = pickle.loads(_swap(comm, pickle.dumps(memory.to_remote_buffer())))
    comm.barrier()
    result = None
    if rank == 0:
        view = memory.to_view()
        transport.write(view, remote)  # warm: connection and metadata
        dst.copy_(src)
        copy_s, write_s = [], []
        for _ in range(pairs):
            t0 = time.perf_counter()
            dst.copy_(src)
            copy_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            transport.write(view, remote)
            write_s.append(time.perf_counter() - t0)
        ratios = [c / w for c, w in zip(copy_s, write_s, strict=True)]
        result = {
            "memcpy_gbps": nbytes / statistics.median(copy_s) / 1e9,
            "write_gbps": nbytes / statistics.median(write_s) / 1e9,
            "ratio_median": statistics.median(ratios),
        }
    comm.barrier()
    if rank == 1:
        assert bool((dst == 1).all()), "the written bytes did not arrive"
    memory.close()
    transport.close()
    comm.finalize()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per copy and write")
    parser.add_argument("--pairs", type=int, default=20, help="interleaved copy/write pairs")
    args = parser.parse_args()
    from torchcomms_core.testing import RankPool

    with RankPool(2) as pool:
        result = pool.run(_rank_body, args.mib << 20, args.pairs, timeout=600)[0]
    print(
        f"{args.mib} MiB, {args.pairs} interleaved pairs: memcpy (1 thread) "
        f"{result['memcpy_gbps']:.2f} GB/s, transport write {result['write_gbps']:.2f} GB/s, "
        f"write/memcpy (median of per-pair ratios) {result['ratio_median']:.2f}"
    )


if __name__ == "__main__":
    main()
