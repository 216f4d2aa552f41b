#!/usr/bin/python3
"""CIFAR-10 training pipeline, side by side in one run: stoker vs torch's
DataLoader over the same bytes with the same transforms (docs/transforms.md).

Writes a CIFAR-10 binary batch of --samples synthetic images, then times:
  - stoker.Loader(dir, batch, transform=RandomCrop(32, padding=4) +
    RandomHorizontalFlip + Normalize, dtype float32), threads = cores;
  - a torch Dataset reading the same batch file (CHW bytes -> PIL image) with
    torchvision's RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor,
    Normalize, in a DataLoader with num_workers = cores;
each for --epochs epochs after one warm-up epoch, and prints samples/s and
the ratio.

    /usr/bin/python3 bench/bench_cifar.py [--samples 20000] [--epochs 3]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import stoker  # noqa: E402
from stoker import transforms as ST  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CORES = len(os.sched_getaffinity(0))


def write_batch(path, n):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    imgs = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(np.concatenate([labels[:, None], imgs], 1).tobytes())


def run_stoker(d, bs, epochs):
    t = ST.Compose([ST.RandomCrop(32, padding=4), ST.RandomHorizontalFlip(),
                    ST.Normalize(mean=MEAN, std=STD)])
    with stoker.Loader(d, bs, transform=t, dtype="float32", threads=CORES) as L:
        for _ in L:  # warm-up epoch
            pass
        n = 0
        t0 = time.perf_counter()
        for _ in range(epochs):
            for x, y in L:
                n += len(y)
        return n / (time.perf_counter() - t0)


def run_torch(path, bs, epochs):
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    import torchvision.transforms as T
    torch.set_num_threads(1)

    class CifarBin(Dataset):
        def __init__(self, path, transform):
            raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
            self.labels = raw[:, 0].astype(np.int64)
            self.imgs = raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            self.t = transform

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            return self.t(Image.fromarray(self.imgs[i])), self.labels[i]

    t = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                   T.Normalize(MEAN, STD)])
    dl = DataLoader(CifarBin(path, t), batch_size=bs, shuffle=True, num_workers=CORES,
                    persistent_workers=True)
    for _ in dl:
        pass
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in dl:
            n += len(y)
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stk-bench-cifar-") as d:
        path = os.path.join(d, "data_batch_1.bin")
        write_batch(path, a.samples)
        s = run_stoker(d, a.batch_size, a.epochs)
        t = run_torch(path, a.batch_size, a.epochs)
    print(f"CIFAR-10 train pipeline (RandomCrop(32, padding=4) + flip + Normalize, float32), "
          f"{a.samples} samples, batch {a.batch_size}, {CORES} cores, {a.epochs} epochs")
    print(f"  DataLoader   {t:10.0f} samples/s")
    print(f"  stoker       {s:10.0f} samples/s   {s / t:.2f}x")


if __name__ == "__main__":
    main()
