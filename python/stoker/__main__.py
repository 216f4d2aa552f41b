"""`python -m stoker ARGS` and the `stoker` console script: the command-line
tool (docs/cli.md), the same program `make install` puts in bin/.

pip builds the tool into the package (setup.py: stoker/_bin/stoker, linked
from tools/*.c and the library's sources); this module replaces the Python
process with it (exec), so its exit status, signals and output are the
tool's own. In a source tree where the package is used in place (`make
python`, PYTHONPATH=python), the Makefile's build/release/stoker is run
instead.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _tool():
    """Path of the stoker executable, or None."""
    candidates = [os.path.join(_HERE, "_bin", "stoker"),
                  # python/stoker/ in the repository: the Makefile's build.
                  os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "release",
                               "stoker")]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    tool = _tool()
    if tool is None:
        sys.stderr.write("stoker: the command-line tool is not installed with this package "
                         f"(no executable at {os.path.join(_HERE, '_bin', 'stoker')}); "
                         "reinstall it with pip, or build it with `make tools`\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(tool, ["stoker"] + args)


if __name__ == "__main__":
    sys.exit(main())
