"""The rank side of a pool started by mpiexec (``testing.mpi_launch`` starts it).

``mpiexec -n N python -m torchcomms_core.testing._mpi_rank ADDRESS DIR``: each process
connects back to the pool and serves test bodies like a spawned rank.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import sys

from torchcomms_core.foundation import env as _env
from torchcomms_core.testing.pool import serve


def _main(address: str, tmpdir: str) -> None:
    found = _env.rank_and_size()
    if found is None:
        sys.exit("torchcomms_core.testing._mpi_rank: start me with mpiexec")
    rank, size, _source = found
    # Test bodies ask the pool's usual way (current_rank()); the values are mpiexec's.
    os.environ["TORCHCOMM_RANK"], os.environ["TORCHCOMM_SIZE"] = str(rank), str(size)
    with open(os.path.join(tmpdir, "authkey"), "rb") as f:
        authkey = f.read()
    host, port = address.rsplit(":", 1)
    conn = multiprocessing.connection.Client((host, int(port)), authkey=authkey)
    conn.send((rank, os.getpid()))
    serve(conn, os.path.join(tmpdir, f"rank{rank}.stacks"))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
