#!/usr/bin/python3
"""Data-parallel training fed by stoker, launched by torchrun (CPU, gloo).

    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node=2 \\
        --redirects 2 --tee 2 --log_dir /tmp/ddp-logs \\
        examples/train_ddp.py --data data/default --epochs 2

    # from an object store, one shared disk cache per node:
    ... examples/train_ddp.py --data s3://bucket/imagenet-stk --endpoint http://127.0.0.1:9000 \\
        --cache-dir /tmp/stoker-cache --order shards

(The --redirects/--tee/--log_dir flags work around Debian's torch 1.13 on
Python 3.11, see docs/distributed.md.) Each rank opens the same Loader:
stoker takes the rank and world size from the initialised process group and
reads its share of every epoch. Rank 0 saves a checkpoint (model, optimiser,
and the loader's state dict) every --checkpoint-every steps; --resume
continues from it exactly, also with another number of ranks (elastic
resume: the rest of the epoch is spread over the new world, each sample once).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import stoker


def model_for(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, max(classes, 2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/default", help="dataset path or URL")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--size", type=int, default=64, help="crop size")
    ap.add_argument("--threads", default=None, help="loader threads per rank (or auto)")
    ap.add_argument("--order", default="global", choices=["global", "shards"])
    ap.add_argument("--cache-dir", help="disk cache for remote datasets (shared on the node)")
    ap.add_argument("--endpoint", help="S3 endpoint URL")
    ap.add_argument("--checkpoint", default="/tmp/stoker-ddp.ckpt")
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--max-steps", type=int, help="stop after this many steps (a quick run)")
    a = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    options = {"endpoint": a.endpoint} if a.endpoint else None
    threads = a.threads if a.threads in (None, "auto") or not a.threads.isdigit() \
        else int(a.threads)
    loader = stoker.Loader(a.data, a.batch_size, transform="imagenet-train", size=a.size,
                           threads=threads, order=a.order, cache_dir=a.cache_dir,
                           options=options)
    model = DDP(model_for(loader.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if a.resume and os.path.exists(a.checkpoint):
        ckpt = torch.load(a.checkpoint)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"])   # saved by rank 0, any world size
        if rank == 0:
            print(f"resumed at epoch {ckpt['loader']['epoch']} batch {ckpt['loader']['batch']} "
                  f"(saved by a world of {ckpt['loader']['world_size']}, now {world})")
    if rank == 0:
        print(f"{world} ranks, {loader.num_samples} samples, {len(loader)} batches of "
              f"{a.batch_size} per rank per epoch, {loader.threads} loader threads each")
    step = 0
    t0 = time.time()
    while loader.epoch < a.epochs:
        epoch = loader.epoch
        seen = 0
        for images, labels in loader:   # continues a restored epoch where it stopped
            x = images.float().div_(255)
            loss = F.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()   # DDP all-reduces the gradients: the ranks stay in step
            opt.step()
            seen += len(labels)
            step += 1
            if rank == 0 and step % a.checkpoint_every == 0:
                tmp = a.checkpoint + ".tmp"
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "loader": loader.state_dict()}, tmp)
                os.replace(tmp, a.checkpoint)
            if a.max_steps and step >= a.max_steps:
                break
        if rank == 0:
            print(f"epoch {epoch}: {seen} samples on rank 0, loss {loss.item():.3f}, "
                  f"{time.time() - t0:.1f} s")
        if a.max_steps and step >= a.max_steps:
            break
    st = loader.stats()
    if rank == 0:
        print(f"rank 0: loader starvation {st['starvation_s']:.2f} s of {time.time() - t0:.1f} s")
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
