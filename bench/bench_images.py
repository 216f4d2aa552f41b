#!/usr/bin/python3
"""Images, side by side in one run: `stoker bench` vs PyTorch's DataLoader.

For each dataset kind (web: ~400x350 q85-90 4:2:0; q96: q96 4:4:4; 2mp:
1600x1200-ish q90), in ImageFolder layout made from Debian's photographs:
  - PyTorch: torchvision ImageFolder + the equivalent transforms with uint8
    output (PILToTensor), DataLoader(batch_size, shuffle, num_workers=cores,
    persistent_workers=True), one warm-up epoch, then timed epochs; peak PSS of
    parent + workers sampled from /proc/*/smaps_rollup.
  - stoker: `stoker bench --transform T --threads cores --epochs 1 --json`
    to warm the page cache, then the same with `--epochs E`; its samples/s
    covers the whole run from before the loader opens (open and first batch
    included, while the DataLoader's timed epochs start with its workers
    running, so stoker is if anything under-reported), peak RSS.
  - decode limit: cores x single-core libjpeg-turbo full-decode images/s on the
    same files, in memory.
Prints images/s, the ratios, and memory.

usage: bench/bench_images.py [--kinds web,q96,2mp] [--transform imagenet-train]
                             [--batch-size 128] [--epochs 2]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.path.join(ROOT, "build", "release", "stoker")
CORES = os.cpu_count() or 1
SIZES = {"web": 200, "q96": 200, "2mp": 20}  # images per class (10 classes)


def dataset(kind):
    path = os.path.join(ROOT, "data", "bench-" + kind)
    if not os.path.isdir(path):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-dataset.py"), path,
                        "--kind", kind, "--per-class", str(SIZES[kind])], check=True)
    return path


def decode_limit(path):
    exe = os.path.join(ROOT, "build", "jpeg_decode_limit")
    src = os.path.join(ROOT, "bench", "jpeg_decode_limit.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["gcc", "-O2", "-o", exe, src, "-ljpeg"], check=True)
    files = sorted(glob.glob(os.path.join(path, "*", "*")))
    out = subprocess.run([exe] + files, check=True, capture_output=True, text=True).stdout
    return float(out) * CORES


def torch_transform(name, size):
    import torchvision.transforms as T
    if name == "imagenet-train":
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    if name == "imagenet-val":
        return T.Compose([T.Resize(round(size * 256 / 224)), T.CenterCrop(size), T.PILToTensor()])
    raise SystemExit("no torchvision equivalent for " + name)


class PssSampler(threading.Thread):
    """Samples the total PSS of this process and its children."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.stop = False

    @staticmethod
    def pss(pid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def pids(self):
        me = os.getpid()
        out = [me]
        try:
            with open(f"/proc/{me}/task/{me}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
        return out

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, sum(self.pss(p) for p in self.pids()))
            time.sleep(0.1)


def torch_run(path, transform, size, bs, epochs):
    import torch
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    torch.set_num_threads(1)
    ds = ImageFolder(path, transform=torch_transform(transform, size))
    dl = DataLoader(ds, batch_size=bs, shuffle=True, num_workers=CORES, persistent_workers=True)
    sampler = PssSampler()
    sampler.start()
    for _ in dl:  # warm-up epoch
        pass
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in dl:
            n += x.shape[0]
    rate = n / (time.perf_counter() - t0)
    sampler.stop = True
    sampler.join()
    del dl
    return rate, sampler.peak


def stoker_run(path, transform, size, bs, epochs, warmup=True):
    if warmup:
        subprocess.run([STOKER, "bench", path, "--transform", transform, "--size", str(size),
                        "--batch-size", str(bs), "--threads", str(CORES), "--epochs", "1",
                        "--json"], check=True, capture_output=True, text=True)
    out = subprocess.run([STOKER, "bench", path, "--transform", transform, "--size", str(size),
                          "--batch-size", str(bs), "--threads", str(CORES), "--epochs", str(epochs),
                          "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="web,q96,2mp")
    ap.add_argument("--transform", default="imagenet-train")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(STOKER):
        sys.exit("build first: make")
    print(f"images: {a.transform} {a.size}px, uint8, batch {a.batch_size}, {CORES} cores, "
          f"{a.epochs} timed epochs after a warm-up")
    print(f"{'set':5} {'files':>6} {'DataLoader':>11} {'stoker':>9} {'ratio':>6} {'limit':>8} "
          f"{'vs limit':>8} {'DL PSS':>9} {'stk RSS':>9} {'RSS/PSS':>7}")
    for kind in a.kinds.split(","):
        path = dataset(kind)
        nfiles = len(glob.glob(os.path.join(path, "*", "*")))
        limit = decode_limit(path)
        trate, tpss = torch_run(path, a.transform, a.size, a.batch_size, a.epochs)
        s = stoker_run(path, a.transform, a.size, a.batch_size, a.epochs)
        srate, srss = s["samples_per_s"], s["peak_rss_bytes"]
        print(f"{kind:5} {nfiles:6d} {trate:9.0f}/s {srate:7.0f}/s {srate / trate:5.2f}x "
              f"{limit:6.0f}/s {srate / limit:7.2f}x {tpss / 2**20:7.0f}Mi {srss / 2**20:7.0f}Mi "
              f"{srss / tpss:7.2f}", flush=True)


if __name__ == "__main__":
    main()
