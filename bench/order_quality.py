#!/usr/bin/python3
"""What the shard-aware and block orders give up in randomness, measured.

Writes a .stk dataset of N small samples in shards, reads one epoch's order
with each of the three orders through stoker.Loader (return_indices=True), and
prints for each:

  runs/batch     distinct runs of `per_block` consecutive samples (aligned
                 to multiples of per_block: about the block order's unit)
                 among a batch's samples: how many places a batch draws from
  near pairs     share of consecutive positions whose samples were within
                 `per_block` of each other in the files (0 for a perfect
                 shuffle of a large dataset, up to 1 for file order)
  mean |jump|    mean distance in the files between consecutive samples, as
                 a fraction of N (1/3 for a perfect shuffle)
  lag-1 corr     correlation of the sample index at positions p and p + 1

The defaults mimic the remote benchmark of issue 23: 20,000 samples of ~24 KB
in 5 MiB blocks (about 170 samples a block at 28 KB each), shards of 2,000, window 8.

    /usr/bin/python3 bench/order_quality.py [--samples 20000] [--per-block 170]
"""

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import numpy as np  # noqa: E402
import stoker  # noqa: E402

SAMPLE = 64  # bytes of each sample (only the order matters here)


def order(path, name, batch, block_bytes):
    opts = {"block_bytes": str(block_bytes)} if name == "blocks" else None
    loader = stoker.Loader(path, batch, order=name, seed=1, output="numpy",
                           return_indices=True, options=opts, threads=1)
    idx = np.concatenate([i for _, _, i in loader])
    loader.close()
    return idx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--shard-samples", type=int, default=2000)
    ap.add_argument("--per-block", type=int, default=170)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stk-order-quality-")
    try:
        path = os.path.join(tmp, "ds")
        with stoker.Writer(path, shard_size=a.shard_samples * SAMPLE) as w:
            for i in range(a.samples):
                w.add(i.to_bytes(8, "little") * (SAMPLE // 8))
        n = a.samples
        # A sample's bytes in the shards (its payload and its index entry),
        # so that a block holds per_block samples.
        stored = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                     if f.endswith(".stk"))
        block_bytes = a.per_block * stored // n
        print(f"{n} samples, shards of ~{a.shard_samples}, blocks of ~{a.per_block}, "
              f"window 8, batch {a.batch}")
        print(f"{'order':8} {'runs/batch':>13} {'near pairs':>11} {'mean |jump|':>12} "
              f"{'lag-1 corr':>11}")
        for name in ("global", "shards", "blocks"):
            idx = order(path, name, a.batch, block_bytes)
            assert sorted(idx.tolist()) == list(range(n)), f"{name}: not a permutation"
            blk = idx // a.per_block
            per_batch = np.mean([len(set(blk[k:k + a.batch].tolist()))
                                 for k in range(0, n - a.batch + 1, a.batch)])
            d = np.abs(np.diff(idx.astype(np.int64)))
            near = float(np.mean(d < a.per_block))
            corr = float(np.corrcoef(idx[:-1], idx[1:])[0, 1])
            print(f"{name:8} {per_batch:13.1f} {near:11.4f} {d.mean() / n:12.3f} {corr:11.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
