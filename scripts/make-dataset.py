#!/usr/bin/python3
"""Builds an ImageNet-like dataset in ImageFolder layout from real photographs
that Debian's mate-backgrounds package ships (/usr/share/backgrounds/mate).

Each class is one source photograph; each sample is a random crop of it, at a
random scale, resized to an ImageNet-like size (mean about 400x350), so the
files are distinct real-photo JPEGs. Deterministic for a given seed.

The wallpapers are smoother than ImageNet's photos (much soft focus), so the
ImageNet-sized kinds get the sharpening cameras apply (an unsharp mask): it
brings the entropy-coded bytes per pixel, which is what decoding costs, to
ImageNet's level (q96: ~80 KB a file, as ImageNet's ~110 KB at 500x375).

Kinds (--kind):
  web   quality 85-90, 4:2:0 (a typical web encoding, ~30 KB)       [default]
  q96   quality 96, 4:4:4 (ImageNet's heavier encoding, ~80 KB)
  2mp   1600x1200-ish, quality 90, 4:2:0 (COCO/OpenImages-like, ~300 KB)

usage: make-dataset.py OUT [--kind web|q96|2mp] [--per-class N] [--classes N] [--seed S]
"""
import argparse
import glob
import os
import random
import sys

from PIL import Image, ImageFilter

PHOTO_DIRS = ["/usr/share/backgrounds/mate/nature", "/usr/share/backgrounds/mate/abstract"]


def sources():
    files = sorted(glob.glob(os.path.join(PHOTO_DIRS[0], "*.jpg")))
    files += [os.path.join(PHOTO_DIRS[1], "Elephants.jpg")]
    files = [f for f in files if os.path.exists(f)]
    if not files:
        sys.exit("make-dataset: no photographs found; install Debian's mate-backgrounds "
                 "(scripts/install-deps.sh does)")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--kind", default="web", choices=["web", "q96", "2mp"])
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    photos = sources()[: a.classes]
    rng = random.Random(a.seed)
    tmp = a.out + ".partial"
    os.makedirs(tmp, exist_ok=True)
    total = len(photos) * a.per_class
    done = 0
    tty = sys.stderr.isatty()
    for ci, path in enumerate(photos):
        cls = "n%02d_%s" % (ci, os.path.splitext(os.path.basename(path))[0].lower())
        os.makedirs(os.path.join(tmp, cls), exist_ok=True)
        src = Image.open(path).convert("RGB")
        W, H = src.size
        for k in range(a.per_class):
            if a.kind == "2mp":
                tw, th = rng.choice([(1600, 1200), (1200, 1600), (1920, 1080), (1440, 1080)])
            else:
                tw, th = rng.randint(300, 500), rng.randint(260, 440)
            # A random window of the photo with the target's aspect ratio, at
            # least as large as the target where the photo allows.
            scale = rng.uniform(0.35, 1.0)
            cw = min(W, max(int(W * scale), 16))
            ch = min(H, max(int(cw * th / tw), 16))
            cw = min(W, int(ch * tw / th))
            x, y = rng.randint(0, W - cw), rng.randint(0, H - ch)
            im = src.crop((x, y, x + cw, y + ch)).resize((tw, th), Image.BILINEAR, reducing_gap=None)
            if rng.random() < 0.5:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            if a.kind != "2mp":
                im = im.filter(ImageFilter.UnsharpMask(radius=1, percent=320, threshold=0))
            if a.kind == "web":
                q, sub = rng.randint(85, 90), 2  # 4:2:0
            elif a.kind == "q96":
                q, sub = 96, 0  # 4:4:4
            else:
                q, sub = 90, 2
            im.save(os.path.join(tmp, cls, "%s_%04d.JPEG" % (cls, k)), "JPEG", quality=q, subsampling=sub)
            done += 1
            if tty:
                print("\rmake-dataset: %d/%d images" % (done, total), end="", file=sys.stderr)
    if tty:
        print(file=sys.stderr)
    os.rename(tmp, a.out)
    print("make-dataset: wrote %d %s images in %d classes to %s" % (total, a.kind, len(photos), a.out))


if __name__ == "__main__":
    main()
