#!/usr/bin/python3
"""Checks that no C function in src/ or tools/ is longer than a limit
(issue 19: 150 lines, body braces included), and that src/loader.c stays
under 1000 lines.

The files follow .clang-format (BreakBeforeBraces: Linux), so a function's
body opens with "{" alone at column 0 and closes with "}" at column 0; the
name is the identifier before the last "(" of the lines above the brace.

    scripts/check-functions.py [--limit 150] [--list N]

Prints each function over the limit, then "functions: N passed, N failed".
"""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def functions(path):
    """Yields (name, first line, length) for each function body in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    start = None
    for k, line in enumerate(lines):
        if line == "{" and start is None:
            start = k
        elif line.startswith("}") and start is not None and not line.startswith("};"):
            sig = []
            j = start - 1
            while j >= 0 and lines[j].strip() and not lines[j].rstrip().endswith((";", "}", "*/")) \
                    and not lines[j].startswith("#"):
                sig.insert(0, lines[j])
                j -= 1
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", " ".join(sig))
            name = names[0] if names else "?"
            yield name, start, k - start + 1
            start = None
        elif line.startswith("};"):
            start = None  # a struct or array initialiser at column 0, not a function


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--list", type=int, default=0, help="also print the N longest")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.c"), recursive=True) +
                   glob.glob(os.path.join(ROOT, "tools", "*.c")))
    passed = failed = 0
    every = []
    for path in files:
        rel = os.path.relpath(path, ROOT)
        for name, first, n in functions(path):
            every.append((n, rel, first + 1, name))
            if n > a.limit:
                failed += 1
                print(f"  [functions] {rel}:{first + 1}: {name} is {n} lines (limit {a.limit})")
            else:
                passed += 1
    with open(os.path.join(ROOT, "src", "loader.c"), encoding="utf-8") as f:
        loader_lines = f.read().count("\n")
    if loader_lines >= 1000:
        failed += 1
        print(f"  [functions] src/loader.c is {loader_lines} lines (limit 999)")
    else:
        passed += 1
    for n, rel, line, name in sorted(every, reverse=True)[:a.list]:
        print(f"  {n:4d}  {rel}:{line}  {name}")
    print(f"functions: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
