#!/usr/bin/python3
"""Unpacked objects against .stk shards from the same server, side by side.

The same images as an unpacked ImageFolder (ROOT/CLASS/NAME.jpg, listed by
nginx's autoindex pages: one GET per sample, docs/remote.md "Unpacked objects
in a bucket") and packed as .stk shards, served by one nginx behind the
delaying TCP proxy (RTT = 2 x --one-way-ms, default 50 ms; a process of its
own), each read by `stoker bench --transform imagenet-train --batch-size 64`:

  unpacked                    every sample a GET of its object (global order)
  unpacked, cache             the same with --cache-dir (cold: the objects are
                              downloaded into the cache, the listing kept)
  unpacked, cache, again      the same cache: the listing read from it (no
                              listing request), the objects from disk
  .stk, blocks                the packed shards in the block order: a GET per
                              ~5 MiB block
  .stk, shards + cache        --order shards --cache-dir (cold): whole shards
                              once

x .stk: samples/s against the .stk row read the same way (no cache: blocks;
cache: shards + cache). Every run is checked to deliver the batches of the
same dataset read from local disk in the same order, bit for bit. The images
are made here (photo-like JPEGs, --images of --side px) unless --data names an
ImageFolder.

    /usr/bin/python3 bench/bench_bucket.py [--images 2000] [--side 256]
        [--classes 10] [--data DIR] [--one-way-ms 25] [--epochs 1]
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


def bench(path, args):
    cmd = [STOKER, "bench", path, "--transform", "imagenet-train", "--batch-size", "64",
           "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode:
        sys.exit(f"bench failed: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def make_images(root, n, side, classes):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(7)
    h, w = side * 3 // 4, side
    y, x = np.mgrid[0:h, 0:w]
    for k in range(n):
        d = os.path.join(root, f"c{k % classes:03d}")
        os.makedirs(d, exist_ok=True)
        # Smooth gradients plus noise: compresses like a photograph.
        img = np.stack([(x * 255 // w + k) % 256, (y * 255 // h), ((x + y) * 127 // (w + h))], -1)
        img = (img + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(d, f"{k:06d}.jpg"), quality=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="an ImageFolder to use instead of made images")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--one-way-ms", type=float, default=25.0)
    ap.add_argument("--shard-size", default="64MiB")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stk-bench-bucket-")
    try:
        www = os.path.join(tmp, "www")
        folder, packed = os.path.join(www, "folder"), os.path.join(www, "packed")
        if a.data:
            shutil.copytree(a.data, folder)
        else:
            make_images(folder, a.images, a.side, a.classes)
        subprocess.run([STOKER, "pack", folder, packed, "--shard-size", a.shard_size, "--quiet"],
                       check=True)
        nbytes = sum(os.path.getsize(os.path.join(dp, f))
                     for dp, _, fs in os.walk(folder) for f in fs)
        nfiles = sum(len(fs) for _, _, fs in os.walk(folder))
        ep = ["--epochs", str(a.epochs)]
        refs = {"folder": bench(folder, ep),
                "blocks": bench(packed, ep + ["--order", "blocks"]),
                "shards": bench(packed, ep + ["--order", "shards"])}
        print(f"imagenet-train, batch 64, {a.epochs} epoch(s) of {nfiles} images "
              f"({nbytes / nfiles / 1e3:.1f} KB on average), RTT {2 * a.one_way_ms:.0f} ms "
              f"through the delaying proxy, nginx autoindex (json), "
              f"{refs['folder']['threads']} threads, {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} at the start")
        print(f"local disk: folder {refs['folder']['samples_per_s']:.0f} samples/s, "
              f".stk blocks {refs['blocks']['samples_per_s']:.0f}, .stk shards "
              f"{refs['shards']['samples_per_s']:.0f}")
        rows = []
        with stk_servers.Nginx(www, autoindex="json") as ngx:
            with stk_servers.ServerProcess("proxy", f"127.0.0.1:{ngx.port}", "--delay-ms",
                                           a.one_way_ms) as px:
                cache_u = tempfile.mkdtemp(prefix="cache-u-", dir=tmp)
                cache_p = tempfile.mkdtemp(prefix="cache-p-", dir=tmp)
                u, p = f"{px.url}/folder", f"{px.url}/packed"
                rows.append(("unpacked", bench(u, ep), "folder", "blocks"))
                rows.append(("unpacked, cache", bench(u, ep + ["--cache-dir", cache_u]),
                             "folder", "shards"))
                rows.append(("unpacked, cache, again", bench(u, ep + ["--cache-dir", cache_u]),
                             "folder", None))
                rows.append((".stk, blocks", bench(p, ep + ["--order", "blocks"]), "blocks", None))
                rows.append((".stk, shards + cache",
                             bench(p, ep + ["--order", "shards", "--cache-dir", cache_p]),
                             "shards", None))
        by = {name: r for name, r, _, _ in rows}
        against = {"blocks": by[".stk, blocks"], "shards": by[".stk, shards + cache"]}
        head = (f"{'run':24} {'samples/s':>9} {'x .stk':>7} {'requests':>8} {'in flight':>9} "
                f"{'open s':>7}")
        print("\n" + head)
        print("-" * len(head))
        for name, r, ref, vs in rows:
            f = r.get("fetch") or {}
            x = f"{r['samples_per_s'] / against[vs]['samples_per_s']:.3f}" if vs else "-"
            print(f"{name:24} {r['samples_per_s']:9.0f} {x:>7} {f.get('requests', '-'):>8} "
                  f"{f.get('inflight_peak', '-'):>9} {r.get('open_s', 0):7.3f}")
            if r["checksum"] != refs[ref]["checksum"]:
                sys.exit(f"{name}: the batches differ from the local run's")
        ratio = by["unpacked"]["samples_per_s"] / by[".stk, blocks"]["samples_per_s"]
        print(f"\nunpacked / .stk without a cache: {ratio:.3f} (.stk {1 / ratio:.1f}x faster); "
              f"with a cache (cold): "
              f"{by['unpacked, cache']['samples_per_s'] / by['.stk, shards + cache']['samples_per_s']:.3f}")
        print("checksums: every run delivered the batches of the same data read from local "
              "disk in its order, bit for bit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
