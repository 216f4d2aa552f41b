#!/usr/bin/python3
"""Trains a small CNN on an ImageFolder dataset (by default the built-in
data/default: 1000 JPEGs, 10 classes), fed by stoker or, for comparison, by
torch's DataLoader with the same transforms.

    /usr/bin/python3 examples/train_cnn.py                       # stoker
    /usr/bin/python3 examples/train_cnn.py --loader dataloader   # torch DataLoader

Both loaders deliver uint8 NCHW batches (RandomResizedCrop + horizontal flip);
the conversion to float and the normalisation run in the training step, on the
device, so only uint8 crosses the bus. Runs on the CPU, or on CUDA when one is
present (--device); there stoker itself copies each batch to the GPU from
pinned memory on a side stream (docs/gpu.md). Prints the mean loss of each
epoch: it goes down.

Run from the repository root after `make MODE=release python` (or put
python/ on PYTHONPATH).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def stoker_loader(root, batch_size, size, threads=None, seed=0, device=None):
    """stoker: the transforms run in C threads; batches are zero-copy tensors
    (on the CPU), or CUDA tensors copied by the loader (device="cuda")."""
    import stoker
    from stoker import transforms as T
    return stoker.Loader(root, batch_size, shuffle=True, seed=seed, threads=threads,
                         transform=T.Compose([T.RandomResizedCrop(size),
                                              T.RandomHorizontalFlip()]),
                         output="torch", device=device)


def dataloader(root, batch_size, size, workers=None, seed=0):
    """The usual recipe: torchvision ImageFolder + DataLoader worker processes."""
    import torchvision.datasets as D
    import torchvision.transforms as TV
    workers = os.cpu_count() if workers is None else workers
    ds = D.ImageFolder(root, transform=TV.Compose([TV.RandomResizedCrop(size),
                                                   TV.RandomHorizontalFlip(),
                                                   TV.PILToTensor()]))
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True,
                                       num_workers=workers, persistent_workers=workers > 0,
                                       generator=g)


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.b1 = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.b2 = nn.BatchNorm2d(64)
        self.c3 = nn.Conv2d(64, 128, 3, stride=2, padding=1)
        self.b3 = nn.BatchNorm2d(128)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        x = F.relu(self.b3(self.c3(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def train(loader, classes, epochs, device, lr=0.01, log=print):
    """Trains for `epochs` passes over loader; returns the mean loss per epoch."""
    torch.manual_seed(0)
    model = SmallCNN(classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    losses = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        model.train()
        total, n, t0 = 0.0, 0, time.perf_counter()
        for images, labels in loader:
            # uint8 NCHW to the device, then float + normalise there
            x = (images.to(device, non_blocking=True).float() - mean) / std
            y = labels.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        secs = time.perf_counter() - t0
        losses.append(total / n)
        log(f"epoch {epoch}: loss {losses[-1]:.4f}  ({n} images, {n / secs:.0f} images/s)")
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/default")
    ap.add_argument("--loader", choices=["stoker", "dataloader"], default="stoker")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--size", type=int, default=64, help="crop size (64 keeps the CPU fast)")
    ap.add_argument("--workers", type=int, default=None,
                    help="stoker threads / DataLoader workers (default: all cores)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args(argv)

    if args.loader == "stoker":
        loader = stoker_loader(args.data, args.batch_size, args.size, args.workers,
                               device=args.device if args.device.startswith("cuda") else None)
        classes = loader.num_classes
    else:
        loader = dataloader(args.data, args.batch_size, args.size, args.workers)
        classes = len(loader.dataset.classes)
    print(f"{args.loader}: {args.data}, {classes} classes, batch {args.batch_size}, "
          f"crop {args.size}, device {args.device}")
    losses = train(loader, classes, args.epochs, args.device, args.lr)
    if hasattr(loader, "close"):
        loader.close()
    went_down = losses[-1] < losses[0]
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}: "
          f"{'went down' if went_down else 'DID NOT GO DOWN'}")
    return 0 if went_down else 1


if __name__ == "__main__":
    sys.exit(main())
