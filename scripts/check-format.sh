#!/usr/bin/env bash
# Checks that the C sources are formatted as .clang-format says (issue 19
# item 7): every .c/.h under src/, include/, tools/, tests/c/, tests/fuzz/,
# python/stoker/ and bench/. Run by scripts/test-all.sh (make test).
#   scripts/check-format.sh          check; exits non-zero if a file differs
#   FIX=1 scripts/check-format.sh    reformat those files in place instead
#   CLANG_FORMAT=clang-format-14 ... pick the binary (default: clang-format)
# Prints "format: N passed, N failed" last; for each failing file, the first
# lines of what clang-format would change.
set -uo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
if ! command -v "$CF" >/dev/null 2>&1; then
    echo "format: 0 passed, 1 failed ($CF is not installed)"
    exit 1
fi
pass=0 fail=0
while IFS= read -r -d '' f; do
    if [ "${FIX:-0}" = 1 ]; then
        "$CF" -i --style=file "$f" || { fail=$((fail + 1)); continue; }
    fi
    if "$CF" --style=file "$f" | cmp -s - "$f"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "  [format] $f: not formatted"
        "$CF" --style=file "$f" | diff -u "$f" - | sed -n '3,14p' | sed 's/^/      /'
    fi
done < <(find src include tools tests/c tests/fuzz python/stoker bench \
              -type f \( -name '*.c' -o -name '*.h' \) -print0 2>/dev/null | sort -z)
echo "format: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
