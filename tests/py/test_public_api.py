"""The front ends stand on the public API alone (issue 19): no file under
tools/ or python/ includes a header from src/ (the tool is also compiled
without -Isrc, see the Makefile), no C test includes a .c file from tools/,
and tools/stoker.c only dispatches, so it and the subcommands (doctor.c,
bench.c, ...) do not call each other both ways."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def _sources(top, exts=(".c", ".h", ".cc", ".cpp")):
    for base, _, files in os.walk(os.path.join(ROOT, top)):
        for f in files:
            if f.endswith(exts):
                yield os.path.join(base, f)


def _src_headers():
    """Every header under src/, by its path relative to src/ and by name."""
    found = set()
    for path in _sources("src", (".h",)):
        rel = os.path.relpath(path, os.path.join(ROOT, "src"))
        found.add(rel)
        found.add(os.path.basename(rel))
    return found


def _internal_includes(path, internal):
    text = open(path, encoding="utf-8", errors="replace").read()
    here = os.path.dirname(path)
    bad = []
    for quote, name in INCLUDE.findall(text):
        if "src/" in name or name.startswith(".."):
            bad.append(name)
        elif quote == '"' and name in internal and not os.path.exists(os.path.join(here, name)):
            bad.append(name)  # found through -Isrc, not beside the file
    return bad


def test_front_ends_include_no_internal_header():
    internal = _src_headers()
    assert "internal.h" in internal and "options.h" in internal  # the check sees src/
    offenders = {}
    for top in ("tools", "python"):
        files = list(_sources(top))
        assert files, top
        for path in files:
            bad = _internal_includes(path, internal)
            if bad:
                offenders[os.path.relpath(path, ROOT)] = bad
    assert not offenders, f"front ends include library internals: {offenders}"


def test_the_check_catches_an_internal_include(tmp_path):
    """The checker itself: a file that includes src/ headers is caught."""
    f = tmp_path / "x.c"
    f.write_text('#include "stoker.h"\n#include "options.h"\n#include "../src/image.h"\n'
                 '#include <stdio.h>\n')
    assert _internal_includes(str(f), _src_headers()) == ["options.h", "../src/image.h"]


def test_no_test_includes_tool_sources():
    offenders = []
    for path in _sources(os.path.join("tests", "c")):
        text = open(path, encoding="utf-8", errors="replace").read()
        for _, name in INCLUDE.findall(text):
            if "tools/" in name and name.endswith(".c"):
                offenders.append((os.path.relpath(path, ROOT), name))
    assert not offenders


def _defined_functions(text):
    """Names of the non-static functions a C file defines."""
    names = set()
    for m in re.finditer(r'^(?!static\b)[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;{]*\)\s*\{', text, re.M):
        names.add(m.group(1))
    return names


def test_stoker_c_only_dispatches():
    stoker = open(os.path.join(ROOT, "tools", "stoker.c")).read()
    assert _defined_functions(stoker) == {"main"}
