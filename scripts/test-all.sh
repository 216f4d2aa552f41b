#!/usr/bin/env bash
# The README's test command: every suite, in every mode.
#   1. C tests, release build
#   2. C tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. C tests under ThreadSanitizer (most start loader threads; test_mt_* are
#      the heavily threaded ones)
#   4. fuzz corpora replayed as tests, and each fuzz target for a bounded time
#   5. Python tests (pytest)
#   6. docs links: every relative link in README.md and docs/*.md resolves
#   7. C formatting (scripts/check-format.sh, .clang-format)
#   8. function lengths (scripts/check-functions.py)
# Each suite ends with a closing line "SUITE: N passed, N failed"; the script
# exits non-zero if any suite failed.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh || exit 1
JOBS=${JOBS:-2}
overall=0

# run_suite NAME MODE [FILTER]: builds MODE and runs its test binaries.
run_suite() {
    local name=$1 mode=$2 filter=${3:-test_*}
    if ! make -s -j"$JOBS" MODE="$mode" lib tools tests >"build/$name.log" 2>&1; then
        cat "build/$name.log"
        echo "$name: 0 passed, 1 failed (build failed)"
        overall=1
        return
    fi
    local pass=0 fail=0 t
    for t in build/"$mode"/tests/$filter; do
        [ -x "$t" ] || continue
        local t0=$SECONDS
        if timeout "${TEST_TIMEOUT:-600}" "$t" >"$t.out" 2>&1; then
            pass=$((pass + 1))
            echo "  [$name] $(basename "$t"): ok ($((SECONDS - t0)) s)"
        else
            fail=$((fail + 1))
            echo "  [$name] $(basename "$t"): FAILED ($((SECONDS - t0)) s)"
            tail -n 40 "$t.out" | sed 's/^/      /'
        fi
    done
    echo "$name: $pass passed, $fail failed"
    [ "$fail" -eq 0 ] || overall=1
}

mkdir -p build
# Whether the CUDA kernels are built (nvcc found) or skipped: the device
# stage's tests run on the fake backend either way (docs/gpu.md).
make -s cuda-status
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

echo "== C tests (release) (at ${SECONDS} s)"
run_suite c-release release
echo "== C tests (ASan+UBSan) (at ${SECONDS} s)"
run_suite c-asan asan
echo "== C tests (TSan) (at ${SECONDS} s)"
run_suite c-tsan tsan

if [ -x scripts/test-fuzz.sh ]; then
    echo "== fuzz targets (at ${SECONDS} s)"
    scripts/test-fuzz.sh || overall=1
fi

if [ -d tests/py ] && ls tests/py/test_*.py >/dev/null 2>&1; then
    echo "== Python tests (at ${SECONDS} s)"
    if make -s -j"$JOBS" MODE=release python >build/python.log 2>&1; then
        /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=10 tests/py
        rc=$?
        # pytest's exit 5 means no tests were collected: treat it as a failure.
        [ $rc -eq 0 ] || overall=1
    else
        cat build/python.log
        echo "python: 0 passed, 1 failed (build failed)"
        overall=1
    fi
fi

echo "== docs links (at ${SECONDS} s)"
# Prints "docs-links: N passed, N failed" (scripts/check-doc-links.py).
/usr/bin/python3 scripts/check-doc-links.py || overall=1

echo "== format (at ${SECONDS} s)"
# Prints "format: N passed, N failed" (scripts/check-format.sh): every C file
# as .clang-format says (FIX=1 scripts/check-format.sh reformats).
scripts/check-format.sh || overall=1

echo "== function lengths (at ${SECONDS} s)"
# Prints "functions: N passed, N failed" (scripts/check-functions.py): no C
# function in src/ or tools/ over 150 lines, src/loader.c under 1000.
/usr/bin/python3 scripts/check-functions.py || overall=1

echo "test-all: ${SECONDS} s"
if [ $overall -eq 0 ]; then echo "ALL SUITES PASSED"; else echo "SOME SUITES FAILED"; fi
exit $overall
