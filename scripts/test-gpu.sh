#!/usr/bin/env bash
# The device stage on a machine with an NVIDIA GPU and driver (docs/gpu.md).
# `make test` runs the same tests against the fake backend everywhere; this
# runs them against the real CUDA backend, plus the bandwidth and overlap
# benchmark (bench/gpu_bandwidth.c). Ends with "gpu: N passed, N failed".
#   scripts/test-gpu.sh [DATASET]   (default data/default, made if missing)
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
pass=0
fail=0
step() { # step NAME CMD...
    local name=$1
    shift
    echo "== $name"
    if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "   $name: FAILED"; fi
}
if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo "(no nvidia-smi on PATH)"; fi
make -s cuda-status
if ! make -s -j"$JOBS" MODE=release lib tools tests python; then
    echo "gpu: 0 passed, 1 failed (build failed)"
    exit 1
fi
export STOKER_TEST_DEVICE=cuda
step "test_device on CUDA (release)" build/release/tests/test_device
step "test_device_fields on CUDA (release)" build/release/tests/test_device_fields
# CUDA's driver maps memory where ASan keeps its shadow gap.
if make -s -j"$JOBS" MODE=asan tests; then
    step "test_device on CUDA (ASan)" env ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 \
        build/asan/tests/test_device
    step "test_device_fields on CUDA (ASan)" env ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 \
        build/asan/tests/test_device_fields
else
    fail=$((fail + 1))
fi
if /usr/bin/python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    step "Python device tests on CUDA" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/py/test_device.py
    step "Python fields on CUDA" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/py/test_fields.py -k device
else
    echo "== Python device tests: skipped (this torch has no CUDA: torch.cuda.is_available() is False)"
fi
DATA=${1:-data/default}
[ -d "$DATA" ] || /usr/bin/python3 scripts/make-dataset.py "$DATA"
cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/gpu_bandwidth.c build/release/libstoker.a \
    $(sed -n 's/^LIB_DEPS := //p' Makefile) -o build/gpu_bandwidth &&
    step "bandwidth and end-to-end benchmark" build/gpu_bandwidth "$DATA"
echo "gpu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
