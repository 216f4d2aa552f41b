#!/usr/bin/python3
"""Engine overhead, side by side: stoker vs torch DataLoader on a file of
fixed-size records with no processing (the cost of the loader itself).

For stoker: `stoker bench FILE --record-size R --json` with 1 and 2 threads.
Per-sample cost per thread = threads / (samples/s). The engine's own share is
that minus the time spent inside the source's pread (the `read` stage).
For PyTorch: a map-style Dataset reading the same records with os.pread and
the default collate into a uint8 tensor, with 0 workers and with 2 workers.

usage: bench/engine_overhead.py [--records N] [--record-size R] [--batch-size B]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.path.join(ROOT, "build", "release", "stoker")


def stoker_run(path, rs, bs, threads, epochs):
    out = subprocess.run([STOKER, "bench", path, "--record-size", str(rs), "--batch-size", str(bs),
                          "--threads", str(threads), "--epochs", str(epochs), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def torch_run(path, rs, bs, workers, epochs):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Records(Dataset):
        def __init__(self):
            self.n = os.path.getsize(path) // rs
            self.fd = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.fd is None:
                self.fd = os.open(path, os.O_RDONLY)
            return torch.from_numpy(np.frombuffer(os.pread(self.fd, rs, i * rs), dtype=np.uint8))

    dl = DataLoader(Records(), batch_size=bs, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0)
    for _ in dl:  # warm-up epoch (starts the workers)
        pass
    n = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in dl:
            n += b.shape[0]
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(STOKER):
        sys.exit("build first: make")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "records.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(a.records * a.record_size))
        print(f"engine overhead: {a.records} records of {a.record_size} B, batch {a.batch_size}, "
              f"{a.epochs} epochs, {os.cpu_count()} cores")
        rates = {}
        for t in (1, 2):
            stoker_run(path, a.record_size, a.batch_size, t, 1)  # warm the page cache
            d_ = stoker_run(path, a.record_size, a.batch_size, t, a.epochs)
            rate = d_["samples_per_s"]
            rates[t] = rate
            per = 1e6 * t / rate
            read = d_["stages"]["read"]
            read_us = 1e6 * read["busy_s"] / max(read["items"], 1)
            print(f"  stoker  {t} thread(s): {rate:12.0f} samples/s  {per:.3f} us/sample/thread "
                  f"(pread {read_us:.3f} us, engine {max(per - read_us, 0):.3f} us)")
        print(f"  stoker scaling 1 -> 2 threads: {rates[2] / rates[1]:.2f}x")
        trates = {}
        for w in (0, 2):
            trates[w] = torch_run(path, a.record_size, a.batch_size, w, a.epochs)
            print(f"  torch DataLoader {w} workers: {trates[w]:12.0f} samples/s")
        print(f"  ratio stoker(2 threads) / DataLoader(2 workers): {rates[2] / trates[2]:.1f}x")


if __name__ == "__main__":
    main()
