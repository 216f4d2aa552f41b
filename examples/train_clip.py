#!/usr/bin/python3
"""Trains a tiny CLIP on the CPU: an image encoder and a text encoder learn,
contrastively, which caption goes with which image, fed by stoker from a
WebDataset tar set whose samples have several fields (docs/multimodal.md).

    /usr/bin/python3 examples/train_clip.py [--data data/clip-small] [--steps 60]

The data (made by scripts/make-multimodal.py when missing) has, per sample,
key.jpg, key.txt (a caption naming the photograph among other words),
key.json, key.cls and more; the loader asks for four of them and delivers
dict batches: "image" a uint8 tensor (B, 3, S, S) cropped and flipped in C,
"caption" a list of str, "meta" a list of parsed JSON values, "label" an int64
tensor. The text encoder is a bag of hashed byte bigrams; the loss is
InfoNCE (CLIP's symmetric cross-entropy over the batch's image-caption
similarities). Prints the loss as it goes down.

Run from the repository root after `make MODE=release python` (or put
python/ on PYTHONPATH).
"""
import argparse
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

BUCKETS = 1 << 14  # hashed byte bigrams


def clip_loader(path, batch_size, size, threads=None):
    import stoker
    from stoker import transforms as T
    return stoker.Loader(
        path, batch_size, seed=0, threads=threads, drop_last=True,
        fields={"image": "jpg;png", "caption": "txt", "meta": "json", "label": "cls"},
        transform={"image": T.Compose([T.RandomResizedCrop(size, scale=(0.5, 1.0)),
                                       T.RandomHorizontalFlip()])})


class ImageEncoder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, dim))

    def forward(self, images):  # uint8 NCHW
        return self.net(images.float() / 127.5 - 1)


class TextEncoder(nn.Module):
    """Mean of the embeddings of the caption's byte bigrams (hashed)."""

    def __init__(self, dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(BUCKETS, 128, mode="mean")
        self.proj = nn.Linear(128, dim)

    def forward(self, captions):  # list of str
        ids, offsets = [], []
        for c in captions:
            b = c.lower().encode("utf-8")
            offsets.append(len(ids))
            ids += [(b[i] * 257 + b[i + 1]) % BUCKETS for i in range(len(b) - 1)] or [0]
        return self.proj(self.bag(torch.tensor(ids), torch.tensor(offsets)))


def info_nce(img, txt, logit_scale):
    """CLIP's loss: image k and caption k are the pair; the batch's others
    are the negatives, in both directions."""
    img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    logits = logit_scale.exp() * img @ txt.t()
    target = torch.arange(len(img))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "clip-small"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--size", type=int, default=64, help="crop size (64 keeps the CPU fast)")
    ap.add_argument("--threads", type=int, default=None, help="stoker threads (default: cores)")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    if not os.path.isdir(args.data):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-multimodal.py"),
                        args.data, "--samples", "512", "--shard-size", "128", "--side",
                        "96,160"], check=True)

    torch.manual_seed(0)
    images, texts = ImageEncoder(64), TextEncoder(64)
    logit_scale = nn.Parameter(torch.tensor(2.659))  # log(1/0.07), as CLIP starts
    opt = torch.optim.AdamW([*images.parameters(), *texts.parameters(), logit_scale],
                            lr=args.lr, weight_decay=1e-4)
    loader = clip_loader(args.data, args.batch_size, args.size, args.threads)
    losses, step = [], 0
    while step < args.steps:
        for batch in loader:
            if step == 0:
                m = batch["meta"][0]
                print(f"batch: image {tuple(batch['image'].shape)} {batch['image'].dtype}, "
                      f"{len(batch['caption'])} captions, e.g. {batch['caption'][0][:50]!r}..., "
                      f"meta e.g. tags {m['tags']}, label {batch['label'][:4].tolist()}...")
            loss = info_nce(images(batch["image"]), texts(batch["caption"]), logit_scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if step % 10 == 0 or step == 1:
                print(f"step {step:4d}: loss {loss.item():.4f}")
            if step == args.steps:
                break
    loader.close()
    k = max(1, min(10, len(losses) // 4))
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    print(f"mean loss of the first {k} steps {first:.4f} -> last {k} {last:.4f}: "
          f"{'went down' if last < first else 'DID NOT GO DOWN'}")
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())
