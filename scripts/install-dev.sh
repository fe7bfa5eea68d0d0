#!/usr/bin/env bash
# Install torch (CPU build, pinned), the core and every plugin in editable mode, plus the
# test and documentation dependencies, into the active Python environment.
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
python -m pip install --quiet torch==2.13.0 -e ".[test,docs]" "${plugins[@]}"

# torchft (tests/fault_tolerance/test_torchft.py, examples/torchft_training.py,
# benchmarks/chaos.py): the nightly wheel, pinned, with --no-deps so its loose torch
# requirement can never move the pinned torch, then its small dependencies. Its tests skip,
# saying why, if this fails.
if ! python -m pip install --quiet --no-deps "torchft-nightly==2026.10.26" ||
    ! python -m pip install --quiet "opentelemetry-api>=1.39.0" "opentelemetry-sdk>=1.39.0" \
        "opentelemetry-exporter-otlp-proto-http>=1.39.0" parameterized; then
    echo "install-dev.sh: torchft-nightly could not be installed;" \
         "tests/fault_tolerance/test_torchft.py will be skipped" >&2
fi
