#!/usr/bin/env bash
# Install torch (CPU build, pinned), the core and every plugin in editable mode, plus the
# test dependencies, into the active Python environment.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every folder under plugins/ is a distribution; torchcomms-mpi pulls mpi4py and the
# MPICH wheel (libmpi and mpiexec inside the virtual environment) from the registry, and
# torchcomms-nixl the NIXL wheel (nixl-cu12, with UCX inside; its unpinned torch
# requirement leaves the pinned torch in place).
plugins=()
for dir in plugins/*/; do
    plugins+=(-e "./${dir%/}")
done
python -m pip install --quiet torch==2.13.0 -e ".[test]" "${plugins[@]}"
