"""Build of the Python package, called by pip through pyproject.toml.

pyproject.toml holds the metadata; this file adds what setuptools 66 (Debian
12) cannot read from it: the extension module, the version and where the
package's sources are (python/stoker).

- stoker._stoker is compiled from python/stoker/_stoker.c together with every
  library source, found the way the Makefile finds them (src/*.c src/*/*.c), so
  a new module under src/ is picked up without editing this file. The library
  is thus linked into the extension statically: the installed package needs no
  libstoker.so and no LD_LIBRARY_PATH.
- The libraries it links are the Makefile's LIB_DEPS line.
- The version is read from include/stoker.h (STK_VERSION_MAJOR/MINOR/PATCH), so
  the package's metadata, stoker.__version__ (the C library's stk_version())
  and `stoker version` agree by construction.

- The `stoker` command-line tool ships with the package: tools/*.c are linked,
  with the same library objects the extension was built from, into an
  executable inside the package (stoker/_bin/stoker), which `python -m stoker`
  and the `stoker` console script (pyproject.toml) exec. A separate
  executable rather than the tool's main() inside the extension: the tool is
  then exactly the one `make` builds (its exit status, signals, Ctrl-C, its
  own stdout buffering, and doctor's peak-RSS and CPU figures of its own
  process, not the Python interpreter's).

Warnings are not errors here (a downstream build, like the Makefile's
WERROR=0); the repository's own build (make python) keeps -Werror.
"""

import glob
import os
import re

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
# pip runs this file from the source tree's root; so does a direct
# `python3 path/to/setup.py ...`: setuptools wants paths relative to it.
os.chdir(HERE)


def read_version():
    path = os.path.join(HERE, "include", "stoker.h")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define STK_VERSION_%s +([0-9]+)$" % name, text, re.M)
        if m is None:
            raise RuntimeError("%s: no '#define STK_VERSION_%s N' line" % (path, name))
        parts.append(m.group(1))
    return ".".join(parts)


def link_libraries():
    """The -l names of the Makefile's LIB_DEPS line, the one list of the
    libraries libstoker links (-lpthread is left to -pthread)."""
    path = os.path.join(HERE, "Makefile")
    with open(path, encoding="utf-8") as f:
        m = re.search(r"^LIB_DEPS := (.*)$", f.read(), re.M)
    if m is None:
        raise RuntimeError("%s: no 'LIB_DEPS := ...' line" % path)
    return [a[2:] for a in m.group(1).split() if a.startswith("-l") and a != "-lpthread"]


def library_sources():
    # Sorted, so that builds are reproducible.
    srcs = sorted(glob.glob("src/*.c") + glob.glob("src/*/*.c"))
    if not srcs:
        raise RuntimeError("%s: no C sources under src/" % HERE)
    return srcs


COMPILE_ARGS = ["-std=c11", "-pthread", "-fvisibility=hidden", "-UNDEBUG"]


def tool_sources():
    srcs = sorted(glob.glob("tools/*.c"))
    if not srcs:
        raise RuntimeError("%s: no C sources under tools/" % HERE)
    return srcs


class build_ext_and_tool(build_ext):
    """build_ext, then the `stoker` executable into the package's _bin/."""

    def run(self):
        super().run()
        ext = self.extensions[0]
        # The library objects are the extension's (compile() finds them up to
        # date in build_temp and does not build them again); the tool's own
        # sources are compiled with the same flags.
        objects = self.compiler.compile(
            tool_sources() + library_sources(), output_dir=self.build_temp,
            macros=ext.define_macros, include_dirs=ext.include_dirs,
            extra_postargs=COMPILE_ARGS, depends=ext.depends)
        out_dir = os.path.join(self.build_lib, "stoker", "_bin")
        if self.inplace:
            out_dir = os.path.join("python", "stoker", "_bin")
        self.mkpath(out_dir)
        self.compiler.link_executable(
            objects, "stoker", output_dir=out_dir, libraries=ext.libraries,
            extra_postargs=["-pthread"])

    def get_outputs(self):
        return super().get_outputs() + [os.path.join(self.build_lib, "stoker", "_bin", "stoker")]


extension = Extension(
    "stoker._stoker",
    sources=["python/stoker/_stoker.c"] + library_sources(),
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", None)],
    # The Makefile's flags that matter for behaviour: C11, threads, only the
    # STK_API names exported, and assertions kept as in `make` (Python's own
    # CFLAGS define NDEBUG).
    extra_compile_args=COMPILE_ARGS,
    extra_link_args=["-pthread"],
    libraries=link_libraries(),
    depends=sorted(glob.glob("include/*.h") + glob.glob("src/*.h") + glob.glob("src/*/*.h")),
)

setup(
    version=read_version(),
    # Here rather than in [tool.setuptools], which setuptools 66 calls beta.
    package_dir={"": "python"},
    packages=["stoker"],
    include_package_data=False,
    ext_modules=[extension],
    cmdclass={"build_ext": build_ext_and_tool},
    options={
        # Keep setuptools' build tree apart from the Makefile's build/MODE/.
        "build": {"build_base": "build/pip"},
        # Compile the C sources in parallel, on the CPUs this process may use.
        "build_ext": {"parallel": max(1, min(len(os.sched_getaffinity(0)), 8))},
    },
)
