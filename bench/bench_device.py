#!/usr/bin/python3
"""Do host-to-device copies overlap decoding? Side by side in one run, on
the fake device (the CPU stand-in of docs/gpu.md, whose copies take the time
a bus of --gbps GB/s would take, on a thread of its own):

  cpu      Loader(device=None): batches stay in host memory (no copy at all);
  stoker   Loader(device="fake"): the copy thread copies each batch while
           the workers decode the next ones; the loop waits for the copy of
           the batch it takes (DLPack on the fake syncs on the host);
  serial   Loader(device=None) and the loop then waits the copy time itself,
           as a loop that copies each batch with a blocking .cuda() does.

Each runs --epochs epochs of the built-in dataset with the imagenet-train
pipeline (uint8, the bytes a GPU pipeline would copy), and the loop stands
for a GPU-bound training step: it sleeps, per batch, the time the workers
need to make one (measured by a first run without sleeping), so the step is
the bottleneck as it is when the input pipeline keeps up. The bus speed is
set so that a copy takes --share of a step. Printed: seconds, time the loop
waited in next(), and the ratios to cpu; stoker's ratio near 1.0 means the
copies were hidden, serial's is about 1 + share.

The fake spends CPU where a GPU's copy engine would not (a memcpy of each
batch), which on a small machine takes some of the workers' CPU.

    /usr/bin/python3 bench/bench_device.py [--data data/default] [--epochs 2]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import stoker  # noqa: E402


def run(data, args, device=None, step_s=0.0, serial_copy_s=0.0):
    t0 = time.perf_counter()
    loader = stoker.Loader(data, args.batch_size, transform="imagenet-train", size=args.size,
                           threads=args.threads, device=device, seed=1)
    waited = 0.0
    n = 0
    for _ in range(args.epochs):
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - w0
            if step_s or serial_copy_s:
                time.sleep(step_s + serial_copy_s)
            n += x.shape[0]
            del x, y
    loader.close()
    return time.perf_counter() - t0, waited, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--share", type=float, default=0.5,
                    help="copy time as a share of the time to make a batch (0.5)")
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        sys.exit(f"{args.data}: no dataset (make run creates data/default)")

    run(args.data, args)  # warm the page cache
    prod_s, _, n = run(args.data, args)
    batches = -(-n // args.batch_size)
    batch_bytes = args.batch_size * args.size * args.size * 3
    step_s = prod_s / batches
    copy_s = args.share * step_s
    gbps = batch_bytes / copy_s / 1e9
    os.environ["STOKER_FAKE_GBPS"] = repr(gbps)
    cpu_s, cpu_wait, _ = run(args.data, args, step_s=step_s)
    dev_s, dev_wait, _ = run(args.data, args, device="fake", step_s=step_s)
    ser_s, ser_wait, _ = run(args.data, args, step_s=step_s, serial_copy_s=copy_s)
    print(f"{n} samples in {batches} batches of {batch_bytes / 1e6:.1f} MB (uint8); a step "
          f"(= the workers' time per batch) {step_s * 1e3:.1f} ms; a copy {copy_s * 1e3:.1f} ms "
          f"(fake bus at {gbps:.2f} GB/s)")
    print(f"{'':8} {'seconds':>8} {'waited':>8} {'ratio':>6}")
    for name, s, w in (("cpu", cpu_s, cpu_wait), ("stoker", dev_s, dev_wait),
                       ("serial", ser_s, ser_wait)):
        print(f"{name:8} {s:8.2f} {w:8.2f} {s / cpu_s:6.2f}")
    print(f"copies hidden: stoker {dev_s / cpu_s:.2f}x the time of no copy at all, the serial "
          f"copy {ser_s / cpu_s:.2f}x (expected {1 + args.share:.2f}x)")


if __name__ == "__main__":
    main()
