#!/usr/bin/python3
"""Mixing datasets, side by side in one run (docs/mixing.md):

  - mix:    stoker.Loader([Source(a), Source(b), Source(c)]) with weights in
            proportion to their sizes, samples_per_epoch = their total;
  - single: stoker.Loader(union) over one folder holding the same images
            (links), the same pipeline: what mixing costs;
  - torch:  the usual PyTorch way, a WeightedRandomSampler over a
            ConcatDataset of three ImageFolders in a DataLoader with as many
            workers as stoker has threads (PIL + torchvision transforms).

    /usr/bin/python3 bench/bench_mix.py [--data data/bench-mix] [--epochs 2]
                                        [--repeat 3] [--threads 2]
                                        [--photos /work/bench-ds10k]

The sources' images are random 40x40 noise upsampled to --side, or with
--photos DIR real JPEG photos found under DIR (1000 evenly spaced in path
order, dealt to the three sources in proportion, as links, so each holds a spread
of DIR's class folders), in --data (default data/bench-mix-photos then).

The pipeline on every side: decode, RandomResizedCrop(--size) +
RandomHorizontalFlip, uint8 NCHW (--normalize: then ToTensor + Normalize,
float32 NCHW, the usual float recipe), batches of --batch. Each configuration runs
in its own process, --repeat times, interleaved; the best run counts (the
machine is shared). The clock runs from before the loader is made to the last
batch of the last epoch. Prints samples/s, CPU time a sample, and the ratios
mix/single (issue 22's target: within 2 %) and mix/torch (target >= 5x).
"""
import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (600, 300, 100)   # images of the three sources
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)   # --normalize: ImageNet's


def make_data(root, side):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for s, n in enumerate(SIZES):
        for c in range(2):
            d = os.path.join(root, f"src{s}", f"c{c}")
            os.makedirs(d, exist_ok=True)
            u = os.path.join(root, "union", f"c{c}")
            os.makedirs(u, exist_ok=True)
            for k in range(n // 2):
                img = rng.integers(0, 255, (side // 8, side // 8, 3), dtype=np.uint8)
                img = Image.fromarray(img).resize((side, side), Image.BILINEAR)
                path = os.path.join(d, f"{k:05d}.jpg")
                img.save(path, quality=90)
                os.symlink(path, os.path.join(u, f"s{s}-{k:05d}.jpg"))
    with open(os.path.join(root, "done"), "w") as f:
        f.write("ok\n")


def make_photo_data(root, photos):
    """The three sources (and the union) as links to real JPEGs under photos."""
    found = []
    for d, _, files in os.walk(photos):
        found += [os.path.join(d, f) for f in files
                  if f.lower().endswith((".jpg", ".jpeg"))]
    found.sort()
    need = sum(SIZES)
    if len(found) < need:
        sys.exit(f"--photos {photos}: {len(found)} JPEG files, the three sources need {need}")
    # Evenly spaced over the sorted list (every class folder).
    picked = [found[i * len(found) // need] for i in range(need)]
    slots = {s: 0 for s in range(len(SIZES))}
    for path in picked:
        # The source furthest behind its share: each gets every class in
        # proportion to its size.
        s = min(range(len(SIZES)), key=lambda x: (slots[x] + 1) / SIZES[x])
        k = slots[s]
        slots[s] += 1
        c = k % 2
        d = os.path.join(root, f"src{s}", f"c{c}")
        u = os.path.join(root, "union", f"c{c}")
        os.makedirs(d, exist_ok=True)
        os.makedirs(u, exist_ok=True)
        link = os.path.join(d, f"{k:05d}.jpg")
        os.symlink(os.path.abspath(path), link)
        os.symlink(os.path.abspath(path), os.path.join(u, f"s{s}-{k:05d}.jpg"))
    with open(os.path.join(root, "done"), "w") as f:
        f.write(f"photos {os.path.abspath(photos)}\n")


def run_one(kind, a):
    """One configuration in this process; prints a JSON line."""
    import torch
    spec = f"RandomResizedCrop({a.size})|RandomHorizontalFlip()"
    if a.normalize:
        spec += f"|ToTensor()|Normalize(mean={MEAN}, std={STD})"
    srcs = [os.path.join(a.data, f"src{s}") for s in range(3)]
    n = 0
    t0 = time.perf_counter()
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    if kind in ("mix", "single"):
        import stoker
        if kind == "mix":
            ld = stoker.Loader([stoker.Source(p, weight=w) for p, w in zip(srcs, SIZES)],
                               a.batch, transform=spec, threads=a.threads,
                               samples_per_epoch=sum(SIZES))
        else:
            ld = stoker.Loader(os.path.join(a.data, "union"), a.batch, transform=spec,
                               threads=a.threads)
        with ld:
            for e in range(a.epochs):
                ld.set_epoch(e)
                for x, y in ld:
                    n += len(y)
    else:
        import torchvision
        from torch.utils.data import ConcatDataset, DataLoader, WeightedRandomSampler
        from torchvision import transforms as T
        tail = [T.ToTensor(), T.Normalize(MEAN, STD)] if a.normalize else [T.PILToTensor()]
        tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip()] + tail)
        parts = [torchvision.datasets.ImageFolder(p, transform=tf) for p in srcs]
        cat = ConcatDataset(parts)
        # Each sample weighted so a source's total weight is its share.
        weights = [w / len(d) for d, w in zip(parts, SIZES) for _ in range(len(d))]
        sampler = WeightedRandomSampler(weights, num_samples=sum(SIZES))
        dl = DataLoader(cat, a.batch, sampler=sampler, num_workers=a.threads,
                        persistent_workers=True)
        for e in range(a.epochs):
            for x, y in dl:
                n += len(y)
        del dl
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime + ch.ru_utime + ch.ru_stime)
    print(json.dumps({"kind": kind, "samples": n, "wall": wall, "cpu": cpu}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="the sources' folder (default data/bench-mix, with "
                                  "--photos data/bench-mix-photos)")
    p.add_argument("--photos", help="build the sources from the JPEG photos under this folder "
                                    "(links) instead of generated noise images")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--side", type=int, default=320, help="stored images' side")
    p.add_argument("--normalize", action="store_true",
                   help="the usual float recipe on every side: ToTensor + Normalize (ImageNet's "
                        "mean/std) after the crop and flip (float32 NCHW)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        run_one(a.one, a)
        return
    if not a.data:
        a.data = os.path.join(ROOT, "data", "bench-mix-photos" if a.photos else "bench-mix")
    done = os.path.join(a.data, "done")
    if a.photos and os.path.exists(done):
        with open(done) as f:
            if f.read().strip() != f"photos {os.path.abspath(a.photos)}":
                sys.exit(f"{a.data} holds other images than --photos {a.photos}: "
                         "give another --data")
    if not os.path.exists(done):
        if a.photos:
            print(f"linking {sum(SIZES)} photos from {a.photos} into {a.data} ...", flush=True)
            make_photo_data(a.data, a.photos)
        else:
            print(f"making {sum(SIZES)} JPEGs in {a.data} ...", flush=True)
            make_data(a.data, a.side)
    for root, _, files in os.walk(a.data):   # warm the page cache
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                fh.read()
    kinds = ("mix", "single", "torch")
    results = {k: [] for k in kinds}
    for r in range(a.repeat):
        for k in kinds:
            args = [sys.executable, os.path.abspath(__file__), "--one", k, "--data", a.data,
                    "--epochs", str(a.epochs), "--threads", str(a.threads),
                    "--batch", str(a.batch), "--size", str(a.size)]
            args += ["--normalize"] if a.normalize else []
            out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
            results[k].append(json.loads(out.strip().splitlines()[-1]))
    best = {}
    for k in kinds:
        runs = results[k]
        rate = max(x["samples"] / x["wall"] for x in runs)
        cpu = sorted(x["cpu"] / x["samples"] for x in runs)[len(runs) // 2]
        best[k] = rate
        print(f"{k:7s} {rate:9.0f} samples/s  {cpu * 1e3:6.2f} ms CPU/sample "
              f"({len(runs)} runs, {runs[0]['samples']} samples each)")
    print(f"mix / single: {best['mix'] / best['single']:.3f}   "
          f"mix / torch: {best['mix'] / best['torch']:.2f}x")


if __name__ == "__main__":
    main()
