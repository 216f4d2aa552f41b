#!/usr/bin/env bash
# Fuzz suite (called by scripts/test-all.sh):
#   1. replays every seed-corpus file of each target as a regular test, built
#      with the project compiler under ASan+UBSan (runs even without clang);
#   2. builds each libFuzzer target with clang -fsanitize=fuzzer,address,
#      undefined and fuzzes it for FUZZ_SECONDS (default 30) seconds, starting
#      from a scratch copy of the seed corpus.
# FUZZ_TARGETS="parquet tar" runs only those targets.
# Prints "fuzz: N passed, N failed" last; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
CC=${CC:-gcc}
OUT=build/fuzz
mkdir -p "$OUT"
pass=0 fail=0
TARGETS=${FUZZ_TARGETS:-"stk tar image s3xml fields mds litdata tfrecord stkindex parquet listing"}
LIB_SRCS="src/alloc.c src/api.c src/fields.c src/source/*.c src/io/*.c src/cache/*.c
          src/image.c src/codec/*.c src/ops/*.c"
LIBS="-lxxhash -lzstd -lsnappy -lz -ljansson -ljpeg -lspng -lcurl -lpthread -lm"
FLAGS="-std=c11 -D_GNU_SOURCE -g -Iinclude -Isrc -pthread"

result() { # NAME OK?
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1)); echo "  [fuzz] $1: ok"
    else
        fail=$((fail + 1)); echo "  [fuzz] $1: FAILED"
    fi
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# build_lib NAME COMPILER FLAGS...: compiles LIB_SRCS once into $OUT/NAME.a
# (JOBS at a time); every target of that flavour links it, instead of
# compiling the library again per target.
build_lib() {
    local name=$1 cc=$2
    shift 2
    local dir=$OUT/obj-$name
    rm -rf "$dir" && mkdir -p "$dir"
    # shellcheck disable=SC2086
    if ! printf '%s\n' $LIB_SRCS | xargs -P "${JOBS:-2}" -I{} sh -c \
        'd=$1 src=$2 cc=$3; shift 3; exec "$cc" "$@" -c "$src" -o "$d/$(echo "$src" | tr / _).o"' \
        _ "$dir" {} "$cc" \
        "$@" >"$OUT/$name-lib.log" 2>&1; then
        cat "$OUT/$name-lib.log"
        return 1
    fi
    rm -f "$OUT/$name.a" && ar rcs "$OUT/$name.a" "$dir"/*.o
}

REPLAY_FLAGS="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
# shellcheck disable=SC2086
if ! build_lib replay "$CC" $FLAGS $REPLAY_FLAGS; then
    result "replay library (build)" 1
    echo "fuzz: $pass passed, $fail failed"
    exit 1
fi
for t in $TARGETS; do
    corpus=tests/fuzz/corpus/$t
    bin=$OUT/replay_$t
    # shellcheck disable=SC2086
    if $CC $FLAGS $REPLAY_FLAGS -o "$bin" tests/fuzz/fuzz_$t.c tests/fuzz/replay_main.c \
        "$OUT/replay.a" $LIBS >"$OUT/replay_$t.log" 2>&1; then
        "$bin" "$corpus"/* >"$OUT/replay_$t.out" 2>&1
        rc=$?
        [ $rc -eq 0 ] || tail -n 30 "$OUT/replay_$t.out" | sed 's/^/      /'
        result "replay $t corpus ($(ls "$corpus" | wc -l) files)" $rc
    else
        cat "$OUT/replay_$t.log"
        result "replay $t corpus (build)" 1
    fi
done

CLANG=${CLANG:-$(command -v clang || command -v clang-14 || true)}
if [ -z "$CLANG" ]; then
    echo "  [fuzz] libFuzzer runs skipped: clang is not installed (the corpus replays above still ran)"
else
    # The library is built with fuzzer-no-link (coverage counters, no main);
    # each target links libFuzzer's main.
    # shellcheck disable=SC2086
    fuzz_targets=$TARGETS
    if ! build_lib fuzz "$CLANG" $FLAGS -O1 -fsanitize=fuzzer-no-link,address,undefined \
        -fno-sanitize-recover=all; then
        result "libFuzzer library (build)" 1
        fuzz_targets=""
    fi
    for t in $fuzz_targets; do
        bin=$OUT/fuzz_$t
        # shellcheck disable=SC2086
        if ! "$CLANG" $FLAGS -O1 -fsanitize=fuzzer,address,undefined \
            -fno-sanitize-recover=all -o "$bin" tests/fuzz/fuzz_$t.c "$OUT/fuzz.a" $LIBS \
            >"$OUT/fuzz_$t.log" 2>&1; then
            cat "$OUT/fuzz_$t.log"
            result "libFuzzer $t (build)" 1
            continue
        fi
        work=$OUT/corpus_$t
        rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/$t/* "$work"/
        "$bin" -max_total_time="$FUZZ_SECONDS" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix="$OUT/crash_${t}_" "$work" \
            >"$OUT/fuzz_$t.out" 2>&1
        rc=$?
        if [ $rc -ne 0 ]; then
            tail -n 40 "$OUT/fuzz_$t.out" | sed 's/^/      /'
        fi
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/fuzz_$t.out" | grep -o '[0-9]*$')
        result "libFuzzer $t for ${FUZZ_SECONDS}s (${runs:-?} runs)" $rc
    done
fi

echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
