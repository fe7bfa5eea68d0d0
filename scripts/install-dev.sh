#!/usr/bin/env bash
# Install torch (pinned), the core and every plugin in editable mode, plus the test and
# documentation dependencies, into the active Python environment.
#
# torch is 2.13.0 (its CPU build) unless TORCHCOMM_TORCH_VERSION names another tested
# release: TORCHCOMM_TORCH_VERSION=2.14.1 ./scripts/install-dev.sh (the registry's CUDA
# build, about 5.5 GB with its nvidia-* wheels, which runs on the CPU).
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
TORCH_SPEC="torch==${TORCHCOMM_TORCH_VERSION:-2.13.0}"
python -m pip install --quiet "$TORCH_SPEC" -e ".[test,docs]" "${plugins[@]}"

# Triton for the device windows' kernels (torchcomms.triton; tests/device run them under its
# interpreter on CPU tensors). torch's CUDA builds ship it (2.14.1: triton 3.8.0); torch
# 2.13's CPU build does not, so triton 3.9.0 is added with --no-deps, which cannot move the
# pinned torch. Its tests skip, saying why, if this fails.
if ! python -c "import triton" 2>/dev/null &&
    ! python -m pip install --quiet --no-deps "triton==3.9.0"; then
    echo "install-dev.sh: triton could not be installed; tests/device will be skipped" >&2
fi

# Lightning Fabric and Accelerate (tests/bridge/test_c10d_backend_names.py: their DDP steps
# on a torchcomms backend by name), with --no-deps so their torch requirement cannot move the
# pinned torch, then their small dependencies. Those tests skip, saying why, without them.
if ! python -m pip install --quiet --no-deps "lightning-fabric==2.6.6" "accelerate==1.16.0" ||
    ! python -m pip install --quiet "lightning-utilities>=0.10" psutil pyyaml \
        "huggingface_hub>=0.21" "safetensors>=0.4.3"; then
    echo "install-dev.sh: lightning-fabric or accelerate could not be installed;" \
         "their tests in tests/bridge/test_c10d_backend_names.py will be skipped" >&2
fi

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
