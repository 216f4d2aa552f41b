"""Soak of the Python front end (issue 13 item 16): many stoker.Loader
open/close cycles and many epochs in one process, with the resident set, open
descriptors (/proc/self/fd) and threads (/proc/self/task) checked flat after a
warm-up and printed at each checkpoint.

One cycle opens a loader on a record file (numpy), an ImageFolder of JPEGs and
PNGs decoded and augmented (torch), a packed .stk dataset, and -- where nginx
is installed -- the same .stk dataset over HTTP; runs two epochs on each, leaves
a third iterator abandoned mid-epoch, and closes; a loader that stays open
runs one more epoch per cycle. The C side has tests/c/test_soak.c.

`make test` runs a short soak (40 cycles). The long one, e.g. an hour:

    PYTHONPATH=python /usr/bin/python3 tests/py/test_soak.py --seconds 3600

(--cycles N for a count; it prints a checkpoint line every 10 s.)
"""

import gc
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
STOKER = os.path.join(ROOT, "build", "release", "stoker")

import stoker  # noqa: E402

RSS_SLACK = 16 << 20  # bytes, plus 10% of the warm figure


def figures():
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task"))}


def make_datasets(base):
    """The soak's datasets under base: records, an image folder, a packed one."""
    from PIL import Image
    rec = os.path.join(base, "data.rec")
    rng = np.random.default_rng(3)
    with open(rec, "wb") as f:
        for i in range(300):
            f.write(bytes([i % 10]) + rng.integers(0, 256, 47, dtype=np.uint8).tobytes())
    img = os.path.join(base, "images")
    for k in range(36):
        d = os.path.join(img, f"c{k % 3}")
        os.makedirs(d, exist_ok=True)
        h, w = 30 + (k * 7) % 40, 40 + (k * 11) % 50
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(a).save(os.path.join(d, f"f{k:03d}.{'png' if k % 4 == 0 else 'jpg'}"))
    www = os.path.join(base, "www")
    packed = os.path.join(www, "ds")
    os.makedirs(www)
    subprocess.run([STOKER, "pack", img, packed, "--shard-size", "20K", "--quiet"], check=True)
    return {"records": stoker.Records(rec, 48, label_bytes=1), "images": img,
            "packed": packed, "www": www}


def soak(ds, cycles=40, seconds=None, url=None, log=print):
    """Runs the soak; returns the figures at the end of warm-up and the peak."""
    aug = "RandomResizedCrop(24)|RandomHorizontalFlip()|Normalize(0.5, 0.25)"
    kinds = [
        (ds["records"], dict(output="numpy"), 300),
        (ds["images"], dict(output="torch", transform=aug), 36),
        (ds["packed"], dict(output="numpy", transform="imagenet-val", size=16), 36),
    ]
    if url:
        kinds.append((url, dict(output="numpy", transform="imagenet-val", size=16), 36))
    stay = stoker.Loader(ds["records"], 16, output="torch", seed=1, threads=2)
    t0 = last = time.monotonic()
    warm_after = None if seconds else max(3, cycles // 5)
    base = peak = None
    c = samples = 0
    try:
        while (time.monotonic() - t0 < seconds) if seconds else c < cycles:
            for source, kw, n in kinds:
                with stoker.Loader(source, 7, seed=c, threads=3, **kw) as L:
                    for epoch in range(2):
                        L.set_epoch(epoch)
                        got = sum(len(y) for _, y in L)
                        assert got == n, (source, got, n)
                        samples += got
                    it = iter(L)          # abandoned mid-epoch, then closed
                    x, y = next(it)
                    del x, y, it
            samples += sum(len(y) for _, y in stay)
            c += 1
            gc.collect()
            now = time.monotonic()
            if base is None:
                if (c == warm_after) if warm_after else now - t0 >= 60:
                    base = peak = figures()
                    last = now
                    log(f"    warm after {c} cycles: RSS {base['rss'] / 2**20:.1f} MiB, "
                        f"{base['fds']} fds, {base['threads']} threads")
                continue
            if (now - last < 10) if seconds else c % 5:
                continue
            last = now
            f = figures()
            peak = {k: max(peak[k], f[k]) for k in f}
            log(f"    cycle {c:5d}, {now - t0:6.0f}s, {samples:9d} samples: RSS "
                f"{f['rss'] / 2**20:.1f} MiB, {f['fds']} fds, {f['threads']} threads")
            assert f["fds"] == base["fds"], ("descriptors", base, f)
            assert f["threads"] == base["threads"], ("threads", base, f)
            assert f["rss"] <= base["rss"] + RSS_SLACK + base["rss"] // 10, ("RSS", base, f)
    finally:
        stay.close()
    assert base is not None, "the soak ended before its warm-up"
    log(f"    {c} cycles ({c * len(kinds)} loaders opened and closed), {samples} samples: "
        f"RSS {base['rss'] / 2**20:.1f} MiB after warm-up, peak {peak['rss'] / 2**20:.1f} MiB "
        f"(+{(peak['rss'] - base['rss']) / 2**20:.1f}); fds {base['fds']}, "
        f"threads {base['threads']} flat" + (" (with an HTTP dataset)" if url else ""))
    return base, peak


def _run(base_dir, cycles=40, seconds=None, log=print):
    ds = make_datasets(base_dir)
    if shutil.which("nginx") or os.path.exists("/usr/sbin/nginx"):
        import stk_servers
        with stk_servers.Nginx(ds["www"]) as srv:
            return soak(ds, cycles, seconds, url=f"{srv.url}/ds", log=log)
    log("    nginx not installed: no HTTP dataset in the soak")
    return soak(ds, cycles, seconds, log=log)


def test_soak(tmp_path, capsys):
    assert os.access(STOKER, os.X_OK), f"{STOKER} is missing: the test command builds it first"
    with capsys.disabled():
        print()
        _run(str(tmp_path), cycles=40)


if __name__ == "__main__":
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoker-soak-") as d:
        _run(d, a.cycles, a.seconds)
