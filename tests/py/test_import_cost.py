"""Opening a NumPy loader does not import torch (issue 13, item 10): the
process group is looked up in sys.modules, where it is if the program made
one, rather than by importing torch.distributed (about a second)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_numpy_loader_does_not_import_torch(make_records):
    """A process group exists only if the program imported torch.distributed
    itself: opening a NumPy loader looks in sys.modules rather than importing
    torch (about a second)."""
    rec = make_records(8)
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "python")!r})
import stoker
with stoker.Loader(stoker.Records({rec.path!r}, {rec.record_bytes}, label_bytes=8), 4,
                   output="numpy") as L:
    assert len(list(L)) == 2
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_initialised_process_group_is_still_found(make_records, tmp_path):
    """When the program did import torch.distributed and initialised a
    group, rank and world size come from it."""
    rec = make_records(8)
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / "python")!r})
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path}/pg", rank=0, world_size=1)
import stoker
with stoker.Loader(stoker.Records({rec.path!r}, {rec.record_bytes}, label_bytes=8), 4,
                   output="numpy") as L:
    print(L.rank, L.world_size)
dist.destroy_process_group()
"""
    env = dict(os.environ, WORLD_SIZE="3", RANK="2")   # the group wins over the environment
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["0", "1"]
