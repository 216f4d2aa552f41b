"""The command line from Python's side (issue 24): `python -m stoker` runs the
tool; sizes are the library's syntax in Python too (issue 18.10); libjpeg's
own messages never reach stderr from stoker.pack (issue 24.8). The pip-installed
console script is tested in test_install.py."""

import os
import subprocess
import sys

import numpy as np
import pytest

import stoker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOKER = os.path.join(ROOT, "build", "release", "stoker")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    return env


@pytest.mark.skipif(not os.path.exists(STOKER), reason="needs build/release/stoker (make)")
def test_python_m_stoker_runs_the_tool(tmp_path):
    r = subprocess.run([sys.executable, "-m", "stoker", "version"], capture_output=True,
                       text=True, env=_env(), cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"stoker {stoker.__version__}"
    # The tool's own exit status and message come through.
    r = subprocess.run([sys.executable, "-m", "stoker", "bench", "--batch-size", "x"],
                       capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--batch-size needs a number" in r.stderr


def _records(tmp_path, n=64, size=16):
    path = tmp_path / "data.rec"
    path.write_bytes(bytes(range(size)) * n)
    return stoker.Records(str(path), size)


def test_sizes_in_python_take_the_library_syntax(tmp_path):
    src = _records(tmp_path)
    opts = {"max_input_bytes": "16MiB", "scratch_bytes": "1.5M", "batch_memory": "64MB"}
    with stoker.Loader(src, 8, options=opts, depth="auto", memory_budget="1GiB",
                       output="numpy") as loader:
        assert sum(len(y) for _, y in loader) == 64
    # A remote option's size parses too: on a local path it is then refused
    # at open as one that would change nothing, not as a bad value.
    with pytest.raises(ValueError, match="fetch_buffer applies to remote datasets"):
        stoker.Loader(src, 8, options={"fetch_buffer": "32 MiB"})
    with pytest.raises(ValueError, match="fetch_buffer"):
        stoker.Loader(src, 8, options={"fetch_buffer": "32 QB"})
    with pytest.raises(ValueError, match="max_input_bytes"):
        stoker.Loader(src, 8, options={"max_input_bytes": "16QB"})
    with pytest.raises(ValueError, match="memory_budget"):
        stoker.Loader(src, 8, depth="auto", memory_budget="lots")


def _coarse_jpeg(path):
    """A JPEG whose quantization tables need 16 bits (written as SOF1)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (40, 56, 3)).astype(np.uint8))
    img.save(path, qtables=[[300] * 64, [300] * 64])
    assert b"\xff\xc1" in path.read_bytes()


def test_pack_restart_keeps_libjpeg_quiet(tmp_path, capfd):
    (tmp_path / "src" / "a").mkdir(parents=True)
    _coarse_jpeg(tmp_path / "src" / "a" / "x.jpg")
    capfd.readouterr()  # Pillow's libjpeg says "Caution" while writing it
    res = stoker.pack(str(tmp_path / "src"), str(tmp_path / "out"), restart=True)
    out, err = capfd.readouterr()
    assert "Caution" not in err and "quantization" not in err, err
    assert res["restart_indexed"] == 1
    with stoker.Loader(str(tmp_path / "out"), 1, transform="imagenet-val", size=16,
                       output="numpy") as loader:
        assert sum(len(y) for _, y in loader) == 1
    out, err = capfd.readouterr()
    assert err == ""
