#!/usr/bin/python3
"""Restart-indexed JPEG payloads, side by side in one run (docs/images.md).

For each dataset kind of bench_images.py (web, q96, 2mp), on the same files:
  - the full-decode limit (cores x single-core libjpeg-turbo whole-image
    decodes/s, in memory) and PyTorch's DataLoader (as bench_images.py);
  - `stoker bench` on the ImageFolder, on `stoker pack` shards, and on
    `stoker pack --restart` shards, runs interleaved (--runs, median);
  - pack throughput and shard bytes with and without --restart;
  - the batch checksums of the three stoker runs, which must be equal (the
    pixels are bit-identical).

usage: bench/bench_restart.py [--kinds web,q96,2mp] [--transform imagenet-train]
                              [--batch-size 128] [--epochs 2] [--runs 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_images as bi  # noqa: E402

STOKER = bi.STOKER


def pack(src, out, *extra):
    t0 = time.perf_counter()
    subprocess.run([STOKER, "pack", src, out, "--quiet", *extra], check=True)
    dt = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dt, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="web,q96,2mp")
    ap.add_argument("--transform", default="imagenet-train")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-dataloader", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(STOKER):
        sys.exit("build first: make")
    print(f"restart-indexed payloads: {a.transform} {a.size}px uint8, batch {a.batch_size}, "
          f"{bi.CORES} cores, {a.epochs} epochs a run, median of {a.runs} interleaved runs")
    print(f"{'set':5} {'limit':>8} {'DataLoader':>11} {'folder':>8} {'.stk':>8} {'--restart':>10} "
          f"{'rst/folder':>10} {'rst/stk':>8} {'rst/limit':>9} {'rst/DL':>7} {'size':>7} "
          f"{'pack':>9} {'pack rst':>9}")
    tmp = tempfile.mkdtemp(prefix="stk-bench-restart-")
    try:
        for kind in a.kinds.split(","):
            src = bi.dataset(kind)
            plain, rst = os.path.join(tmp, kind + "-stk"), os.path.join(tmp, kind + "-rst")
            tp, sp = pack(src, plain)
            tr, sr = pack(src, rst, "--restart")
            n = len([f for d in os.listdir(src) for f in os.listdir(os.path.join(src, d))])
            limit = bi.decode_limit(src)
            drate = 0.0
            if not a.no_dataloader:
                drate, _ = bi.torch_run(src, a.transform, a.size, a.batch_size, a.epochs)
            rates = {"folder": [], "stk": [], "rst": []}
            sums = set()
            for _ in range(a.runs):
                for name, path in (("folder", src), ("stk", plain), ("rst", rst)):
                    rep = bi.stoker_run(path, a.transform, a.size, a.batch_size, a.epochs,
                                        warmup=False)
                    rates[name].append(rep["samples_per_s"])
                    sums.add(rep["checksum"])
            if len(sums) != 1:
                sys.exit(f"{kind}: the three runs delivered different batches: {sorted(sums)}")
            f, s, r = (statistics.median(rates[k]) for k in ("folder", "stk", "rst"))
            print(f"{kind:5} {limit:6.0f}/s {drate:9.0f}/s {f:6.0f}/s {s:6.0f}/s {r:8.0f}/s "
                  f"{r / f:9.2f}x {r / s:7.2f}x {r / limit:8.2f}x "
                  f"{(r / drate if drate else 0):6.2f}x {100 * (sr / sp - 1):+6.2f}% "
                  f"{n / tp:7.0f}/s {n / tr:7.0f}/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
