"""Installing stoker like a package (issue 13 item 14).

- `make install DESTDIR=... PREFIX=/usr/local` lays out the header, the static
  and shared library (file, soname and symlinks), stoker.pc, the `stoker` tool
  and its man page (from its --help) and the docs; `make uninstall` removes
  them again.
- A C program compiled with `pkg-config --cflags --libs stoker` against that
  staged install (PKG_CONFIG_SYSROOT_DIR) links and runs against the shared
  library and against the static one, and reads a dataset through it.
- `pip install .` into a fresh venv (--system-site-packages for Debian's NumPy;
  offline: --no-build-isolation --no-index) builds the extension from a copy of
  the source tree; `import stoker` from another directory, with no PYTHONPATH,
  finds the installed package, which opens a loader on a tiny dataset.
- The pip-installed package carries the `stoker` tool: the console script and
  `python -m stoker` run it (version, a bench, a usage error's exit status 2).
- The version agrees everywhere: include/stoker.h, `stoker version`,
  stk_version(), stoker.pc, stoker.__version__ and the package metadata.

Time: the make steps reuse the release build of the test command (a first
build is ~10 s on 2 cores); the pip build compiles every C source again, about
15-30 s on 2 cores.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "/usr/local"

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                                reason="needs make and a C compiler")


def header_version():
    """(major, minor, patch) from include/stoker.h, the one place it is written."""
    with open(os.path.join(ROOT, "include", "stoker.h"), encoding="utf-8") as f:
        text = f.read()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define STK_VERSION_%s +([0-9]+)$" % name, text, re.M)
        assert m, f"include/stoker.h has no STK_VERSION_{name}"
        parts.append(int(m.group(1)))
    return tuple(parts)


VERSION = "%d.%d.%d" % header_version()
SONAME = "libstoker.so.%d" % header_version()[0]
SOFILE = "libstoker.so." + VERSION


def clean_env(**extra):
    """The environment of a fresh shell: nothing that points Python, pip, the
    dynamic loader or stoker's partition defaults somewhere."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "PKG_CONFIG", "VIRTUAL_ENV"))
           and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "RANK", "WORLD_SIZE",
                         "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(extra)
    return env


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}"
    return r.stdout


def make(*args, **kw):
    return run(["make", "-s", "-j2", "-C", ROOT, "MODE=release", *args], **kw)


def public_functions():
    """Names of the functions include/stoker.h declares with STK_API."""
    with open(os.path.join(ROOT, "include", "stoker.h"), encoding="utf-8") as f:
        names = set(re.findall(r"^STK_API\b[^(;]*?\b(stk_[a-z0-9_]+)\(", f.read(), re.M))
    assert len(names) > 20
    return names


def exported(path):
    """The global functions and data a shared object defines (readelf)."""
    out = run(["readelf", "--dyn-syms", "-W", path])
    names = set()
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[4] in ("GLOBAL", "WEAK") and f[6] != "UND":
            names.add(f[7].split("@")[0])
    return names


def dynamic_section(path):
    return run(["readelf", "-d", "-W", path])


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A `make install DESTDIR=stage PREFIX=/usr/local`; returns stage."""
    stage = tmp_path_factory.mktemp("stage")
    make("install", f"DESTDIR={stage}", f"PREFIX={PREFIX}")
    return stage


def test_make_install_lays_out_the_files(staged):
    usr = staged / PREFIX.lstrip("/")
    lib = usr / "lib"
    # The header is the repository's, byte for byte.
    with open(os.path.join(ROOT, "include", "stoker.h"), "rb") as f:
        assert (usr / "include" / "stoker.h").read_bytes() == f.read()
    assert (lib / "libstoker.a").is_file()
    run(["ar", "t", str(lib / "libstoker.a")])  # a valid archive
    # The shared library: one file named with the full version, whose soname is
    # the major one, and the two links a system expects.
    real = lib / SOFILE
    assert real.is_file() and not real.is_symlink()
    assert os.readlink(lib / SONAME) == SOFILE
    assert os.readlink(lib / "libstoker.so") == SONAME
    assert f"Library soname: [{SONAME}]" in dynamic_section(real)
    # It exports every public function and nothing else: no internal stk__
    # name (the test hooks live only in libstoker_test.a), no other symbol.
    syms = exported(str(real))
    public = public_functions()
    assert public <= syms, f"not exported: {sorted(public - syms)}"
    extra = syms - public
    assert not extra, f"exported but not in include/stoker.h: {sorted(extra)}"
    # The tool runs from the staged tree (it carries libstoker statically).
    tool = usr / "bin" / "stoker"
    assert os.access(tool, os.X_OK)
    assert SONAME not in dynamic_section(tool)
    assert run([str(tool), "version"], env=clean_env()).strip() == f"stoker {VERSION}"
    # pkg-config data names the install paths, not the stage.
    pc = (lib / "pkgconfig" / "stoker.pc").read_text()
    assert f"prefix={PREFIX}\n" in pc and f"libdir={PREFIX}/lib\n" in pc
    assert f"includedir={PREFIX}/include\n" in pc and f"Version: {VERSION}\n" in pc
    assert str(staged) not in pc
    # The documentation, and a man page made from the tool's --help that
    # renders without warnings and lists every command.
    docs = usr / "share" / "doc" / "stoker"
    assert (docs / "README.md").is_file() and (docs / "c-api.md").is_file()
    page = usr / "share" / "man" / "man1" / "stoker.1"
    assert f'"stoker {VERSION}"' in page.read_text()
    if shutil.which("groff"):
        text = run(["groff", "-man", "-Tascii", "-ww", "-P", "-cbou", str(page)],
                   env=clean_env())
        assert "warning" not in text
        for cmd in ("bench PATH", "pack SRC OUT", "info PATH", "verify PATH", "version"):
            assert "stoker " + cmd in text, text
        assert "--batch-size N" in text  # hyphens stay ASCII minus signs


def test_shared_library_exports_only_the_public_api():
    """`nm -D` of the built libstoker.so: the functions of include/stoker.h and
    nothing more. Internal stk__ names and the test hooks (stk__alloc_*,
    stk__iofault_*, ...) are built only into build/MODE/libstoker_test.a, which
    the C tests link (STK_TEST, src/internal.h)."""
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    make("lib")
    so = os.path.join(ROOT, "build", "release", SOFILE)
    out = run(["nm", "-D", "--defined-only", so])
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}
    public = public_functions()
    assert public <= names, f"not exported: {sorted(public - names)}"
    internal = sorted(n for n in names if n.startswith("stk__"))
    assert not internal, f"internal names exported from {so}: {internal}"
    other = sorted(names - public)
    assert not other, f"exported but not in include/stoker.h: {other}"
    # The test library does carry the hooks, so the C tests still link them.
    lib = os.path.join(ROOT, "build", "release", "libstoker_test.a")
    make(os.path.relpath(lib, ROOT))
    hooks = {line.split()[-1] for line in run(["nm", "--defined-only", lib]).splitlines()
             if line.endswith(("stk__alloc_fail_after", "stk__iofault_arm"))}
    assert hooks == {"stk__alloc_fail_after", "stk__iofault_arm"}, hooks


def test_make_uninstall_removes_what_install_put(tmp_path):
    stage = tmp_path / "stage"
    make("install", f"DESTDIR={stage}", f"PREFIX={PREFIX}")
    files = [p for p in stage.rglob("*") if p.is_file() or p.is_symlink()]
    assert len(files) >= 8
    make("uninstall", f"DESTDIR={stage}", f"PREFIX={PREFIX}")
    left = [str(p) for p in stage.rglob("*") if p.is_file() or p.is_symlink()]
    assert left == []


PROGRAM = r"""
#include <stoker.h>
#include <stdio.h>
#include <string.h>

/* Reads every record of argv[1] (5-byte records: 1 label byte, 4 payload
 * bytes) and prints the library version, the samples seen and sums of their
 * labels, indices and payload bytes. */
int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    if (strcmp(stk_version(), STK_VERSION_STRING) != 0) {
        fprintf(stderr, "header %s, library %s\n", STK_VERSION_STRING, stk_version());
        return 3;
    }
    stk_options *o;
    stk_loader *l = NULL;
    if (stk_options_create(&o))
        return 4;
    stk_options_set_source(o, argv[1]);
    stk_options_set_records(o, 5, 0, 1);
    stk_options_set_batch_size(o, 4);
    stk_options_set_threads(o, 2);
    int rc = stk_loader_open(&l, o);
    stk_options_destroy(o);
    if (rc) {
        fprintf(stderr, "open: %s\n", l ? stk_loader_errmsg(l) : stk_strerror(rc));
        stk_loader_close(l);
        return 5;
    }
    unsigned long long n = 0, labels = 0, indices = 0, bytes = 0;
    stk_batch *b;
    while ((rc = stk_loader_next(l, &b)) == STK_OK) {
        const unsigned char *d = b->data;
        for (size_t k = 0; k < b->size; k++) {
            labels += (unsigned long long)b->labels[k];
            indices += b->indices[k];
            for (size_t j = 0; j < b->sample_bytes; j++)
                bytes += d[k * b->sample_bytes + j];
        }
        n += b->size;
        stk_batch_release(b);
    }
    if (rc != STK_END) {
        fprintf(stderr, "next: %s\n", stk_loader_errmsg(l));
        stk_loader_close(l);
        return 6;
    }
    stk_loader_close(l);
    printf("%s %llu %llu %llu %llu\n", stk_version(), n, labels, indices, bytes);
    return 0;
}
"""

N_RECORDS = 10


def write_records(path):
    """N_RECORDS 5-byte records: label i, payload (3i+k) for k < 4."""
    with open(path, "wb") as f:
        for i in range(N_RECORDS):
            f.write(bytes([i] + [(3 * i + k) % 256 for k in range(4)]))
    total = sum((3 * i + k) % 256 for i in range(N_RECORDS) for k in range(4))
    s = sum(range(N_RECORDS))
    return f"{VERSION} {N_RECORDS} {s} {s} {total}"


def pkg_config(staged, *args):
    # PKG_CONFIG_LIBDIR (not _PATH) so that only the staged stoker.pc is seen,
    # and the sysroot prefixes the -I and -L paths with the stage.
    env = clean_env(PKG_CONFIG_LIBDIR=str(staged / PREFIX.lstrip("/") / "lib" / "pkgconfig"),
                    PKG_CONFIG_SYSROOT_DIR=str(staged))
    return run(["pkg-config", *args], env=env).split()


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="needs pkg-config")
@pytest.mark.parametrize("linkage", ["shared", "static"])
def test_c_program_builds_with_pkg_config(staged, tmp_path, linkage):
    assert pkg_config(staged, "--modversion", "stoker") == [VERSION]
    src = tmp_path / "app.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "app"
    cflags = pkg_config(staged, "--cflags", "stoker")
    assert f"-I{staged}{PREFIX}/include" in cflags
    if linkage == "shared":
        libs = pkg_config(staged, "--libs", "stoker")
    else:
        # The recipe docs/c-api.md gives: --static adds libstoker's own
        # dependencies (Libs.private); -l:libstoker.a picks the archive.
        libs = ["-l:libstoker.a" if a == "-lstoker" else a
                for a in pkg_config(staged, "--static", "--libs", "stoker")]
    assert f"-L{staged}{PREFIX}/lib" in libs
    run(["cc", "-std=c11", "-Wall", "-Werror", *cflags, "-o", str(exe), str(src), *libs])
    data = tmp_path / "data.rec"
    want = write_records(data)
    dyn = dynamic_section(str(exe))
    libdir = staged / PREFIX.lstrip("/") / "lib"
    if linkage == "shared":
        assert f"Shared library: [{SONAME}]" in dyn
        env = clean_env(LD_LIBRARY_PATH=str(libdir))
        # The dynamic loader resolves the soname to the staged file.
        ldd = run(["ldd", str(exe)], env=env)
        assert re.search(r"%s => %s/%s" % (re.escape(SONAME), re.escape(str(libdir)),
                                           re.escape(SONAME)), ldd), ldd
    else:
        assert "libstoker" not in dyn
        env = clean_env()
    assert run([str(exe), str(data)], env=env, cwd=tmp_path).strip() == want


def copy_source_tree(dst):
    """The source tree without build outputs, data or VCS state, so that pip
    builds from sources alone (not from a `make python` extension)."""
    top_skip = {"build", "data", ".git"}

    def ignore(d, names):
        skip = {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(
            (".so", ".o", ".a", ".egg-info", ".pyc"))}
        if os.path.abspath(d) == ROOT:
            skip |= top_skip & set(names)
        return skip

    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


CHECK = r"""
import importlib.metadata, json, os, sys
import numpy as np
import stoker

path = sys.argv[1]
with open(path, "wb") as f:
    for i in range(10):
        f.write(bytes([i, 7, 7, i]))
src = stoker.Records(path, 4, label_bytes=1)
with stoker.Loader(src, 4, shuffle=False, output="numpy", threads=2) as loader:
    labels, data = [], []
    for x, y in loader:
        labels += [int(v) for v in y]
        data += np.asarray(x).reshape(len(y), -1).tolist()
print(json.dumps({
    "file": stoker.__file__,
    "ext": stoker._stoker.__file__,
    "version": stoker.__version__,
    "metadata": importlib.metadata.version("stoker"),
    "labels": labels,
    "data": data,
}))
"""


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs /usr/bin/python3")
def test_pip_install_into_a_venv(tmp_path):
    try:
        import ensurepip  # noqa: F401  (python3-venv: a venv gets pip)
        import setuptools  # noqa: F401
    except ImportError as e:
        pytest.fail(f"{e}: scripts/install-deps.sh installs python3-venv and python3-setuptools")
    src = tmp_path / "src"
    copy_source_tree(src)
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], env=clean_env())
    py = str(venv / "bin" / "python")
    # The documented offline command; PIP_CONFIG_FILE=/dev/null keeps any
    # machine-wide pip settings (extra indexes, find-links) out of it.
    out = run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
               "--disable-pip-version-check", str(src)],
              env=clean_env(PIP_CONFIG_FILE=os.devnull), cwd=tmp_path)
    assert f"Successfully installed stoker-{VERSION}" in out, out
    # The sources may go away: the installed package stands on its own.
    shutil.rmtree(src)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    got = json.loads(run([py, "-c", CHECK, str(elsewhere / "tiny.rec")], env=clean_env(),
                         cwd=elsewhere).strip().splitlines()[-1])
    site = str(venv / "lib")
    assert got["file"].startswith(site) and got["ext"].startswith(site), got
    assert got["labels"] == list(range(10))
    assert got["data"] == [[7, 7, i] for i in range(10)]
    # The command-line tool comes with the package (issue 24.6: a pip-only
    # user had no `stoker` and `python -m stoker` failed): the console script
    # and `python -m stoker` run the same tool, from anywhere, with no
    # PATH entry for the venv and no source tree.
    script = venv / "bin" / "stoker"
    assert script.is_file()
    env = clean_env(PATH="/usr/bin:/bin")
    for cmd in ([str(script)], [py, "-m", "stoker"]):
        assert run(cmd + ["version"], env=env, cwd=elsewhere).strip() == f"stoker {VERSION}"
        rep = json.loads(run(cmd + ["bench", str(elsewhere / "tiny.rec"), "--record-size", "4",
                                    "--label-bytes", "1", "--batch-size", "4", "--no-shuffle",
                                    "--json"], env=env, cwd=elsewhere))
        assert rep["samples"] == 10 and rep["ok"] is True
        r = subprocess.run(cmd + ["bench"], env=env, cwd=elsewhere, capture_output=True,
                           text=True)
        assert r.returncode == 2 and "bench needs a dataset PATH" in r.stderr
    # One version everywhere: header, package, metadata, the C tool.
    make("tools")
    tool = os.path.join(ROOT, "build", "release", "stoker")
    assert got["version"] == got["metadata"] == VERSION
    assert run([str(tool), "version"]).split() == ["stoker", got["version"]]
    # Every public C function is in the extension: setup.py compiled all of
    # the library's sources (picked up by glob, like the Makefile).
    missing = public_functions() - exported(got["ext"])
    assert not missing, f"the pip-built extension lacks {sorted(missing)}"
