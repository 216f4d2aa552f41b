#!/usr/bin/python3
"""Opening a remote dataset of many shards, with and without its consolidated index.

Packs --shards shards of --per tiny JPEGs each (`stoker pack`, which writes
stoker.index beside the manifest), serves them with nginx behind the
delaying TCP proxy (RTT = 2 x --one-way-ms, default 50 ms), and runs
`stoker bench --epochs 1` on the URL three ways:

  index          the manifest names stoker.index: two requests open it
  index, cached  the same with a cache directory that already holds the index
  no index       the same shards and manifest without the index line (a pack
                 from before it): header, footer and index of every shard

and prints the open time, the time to the first batch (from before the
open), and the requests nginx saw before the first batch.

    /usr/bin/python3 bench/bench_open.py [--shards 2000] [--one-way-ms 25]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "servers"))
import stk_servers  # noqa: E402

STOKER = os.path.join(ROOT, "build", "release", "stoker")


def make_images(root, n):
    from PIL import Image
    for c in range(4):
        os.makedirs(os.path.join(root, f"c{c}"), exist_ok=True)
    for i in range(n):
        im = Image.new("RGB", (24, 24), ((i * 37) % 256, (i * 91) % 256, (i * 13) % 256))
        im.save(os.path.join(root, f"c{i % 4}", f"{i:06d}.jpg"), quality=80)


def bench(url, args, env=None):
    cmd = [STOKER, "bench", url, "--epochs", "1", "--batch-size", "64", "--threads", "2",
           "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode:
        sys.exit(f"bench failed: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=2000)
    ap.add_argument("--per", type=int, default=2)
    ap.add_argument("--one-way-ms", type=float, default=25.0)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stk-bench-open-")
    try:
        src = os.path.join(tmp, "src")
        make_images(src, a.shards * a.per)
        www = os.path.join(tmp, "www")
        os.mkdir(www)
        ds = os.path.join(www, "ds")
        # Same-size JPEGs: a shard size of `per` of them gives `per` a shard.
        size = os.path.getsize(os.path.join(src, "c0", "000000.jpg"))
        subprocess.run([STOKER, "pack", src, ds, "--shard-size", str(size * a.per + size // 2),
                        "--quiet"], check=True)
        shards = sum(1 for f in os.listdir(ds) if f.endswith(".stk"))
        idx = os.path.getsize(os.path.join(ds, "stoker.index"))
        man = open(os.path.join(ds, "stoker.manifest")).read()
        old = "".join(ln for ln in man.splitlines(True) if not ln.startswith("index "))
        rows = []
        with stk_servers.Nginx(www) as ngx, \
                stk_servers.DelayProxy("127.0.0.1", ngx.port, a.one_way_ms) as px:
            url = f"http://127.0.0.1:{px.port}/ds"
            cache = os.path.join(tmp, "cache")
            bench(url, ["--cache-dir", cache])  # fills the index cache (and the shards')
            shutil.rmtree(os.path.join(cache, "stoker-cache"))
            for run in range(a.runs):
                for name, text, extra in (("index", man, []),
                                          ("index, cached", man, ["--cache-dir", cache]),
                                          ("no index", old, [])):
                    with open(os.path.join(ds, "stoker.manifest"), "w") as f:
                        f.write(text)
                    ngx.clear_requests()
                    r = bench(url, extra)
                    if extra:
                        shutil.rmtree(os.path.join(cache, "stoker-cache"), ignore_errors=True)
                    reqs = len(ngx.requests())
                    rows.append((name, r, reqs))
            with open(os.path.join(ds, "stoker.manifest"), "w") as f:
                f.write(man)
        print(f"{shards} shards of {a.per} samples, stoker.index {idx} bytes, RTT "
              f"{2 * a.one_way_ms:.0f} ms through a delaying proxy, 2 threads, batch 64")
        print(f"{'open':<16} {'open s':>7} {'first batch s':>14} {'epoch s':>8} "
              f"{'requests (epoch)':>17}")
        for name, r, reqs in rows:
            print(f"{name:<16} {r['open_s']:7.3f} {r['first_batch_s']:14.3f} "
                  f"{r['seconds']:8.2f} {reqs:17d}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
