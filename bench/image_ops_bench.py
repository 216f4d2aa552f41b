#!/usr/bin/python3
"""Side-by-side cost of stoker's image pipeline and PIL/torchvision's, per
image, one core, files in memory. Builds bench/image_ops_bench.c, makes
~400x350 JPEGs ("web"-like, q90 4:2:0) and 1600x1200 JPEGs ("2mp") from the
photos in /usr/share/backgrounds/mate/nature, and prints microseconds per
image and ratios.

    /usr/bin/python3 bench/image_ops_bench.py [ROUNDS]
"""
import glob
import io
import os
import subprocess
import sys
import tempfile
import time

from PIL import Image
import torch
import torchvision.transforms as T

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PHOTOS = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))


def make_set(d, size, per_photo):
    files = []
    for k, p in enumerate(PHOTOS):
        im = Image.open(p).convert("RGB")
        for m in range(per_photo):
            # Different windows of each photo, resized to the set's size.
            w, h = im.size
            box = (m * w // 16, m * h // 20, w - m * w // 20, h - m * h // 16)
            f = os.path.join(d, f"{size[0]}_{k}_{m}.jpg")
            im.crop(box).resize(size, Image.BILINEAR).save(f, quality=90)
            files.append(f)
    return files


def pil_times(files, rounds):
    datas = [open(f, "rb").read() for f in files]
    torch.manual_seed(0)
    rrc = T.RandomResizedCrop(224)
    flip = T.RandomHorizontalFlip()
    val = T.Compose([T.Resize(256), T.CenterCrop(224)])
    out = {}

    def timeit(fn):
        t0 = time.perf_counter()
        for _ in range(rounds):
            for b in datas:
                fn(b)
        return (time.perf_counter() - t0) / rounds / len(datas) * 1e6

    out["full_decode_us"] = timeit(lambda b: Image.open(io.BytesIO(b)).convert("RGB"))
    out["imagenet_train_us"] = timeit(lambda b: flip(rrc(Image.open(io.BytesIO(b)).convert("RGB"))))
    out["rrc_us"] = timeit(lambda b: rrc(Image.open(io.BytesIO(b)).convert("RGB")))
    out["imagenet_val_us"] = timeit(lambda b: val(Image.open(io.BytesIO(b)).convert("RGB")))
    decoded = [Image.open(io.BytesIO(b)).convert("RGB") for b in datas]
    t0 = time.perf_counter()
    for _ in range(rounds):
        for im in decoded:
            rrc(im)
    out["resize_us"] = (time.perf_counter() - t0) / rounds / len(decoded) * 1e6
    return out


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "image_ops_bench")
        srcs = (["src/alloc.c", "src/image.c"] + sorted(glob.glob(os.path.join(ROOT, "src/codec/*.c"))) +
                sorted(glob.glob(os.path.join(ROOT, "src/ops/*.c"))) + ["bench/image_ops_bench.c"])
        subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Iinclude", "-Isrc", *srcs,
                        "-ljpeg", "-lspng", "-lm", "-o", exe], cwd=ROOT, check=True)
        for name, size, per, r in (("web 400x350", (400, 350), 8, rounds), ("2mp 1600x1200", (1600, 1200), 1, max(1, rounds // 2))):
            files = make_set(d, size, per)
            res = subprocess.run([exe, str(r), *files], capture_output=True, text=True, check=True).stdout
            ours = {k: float(v) for k, v in (line.split() for line in res.splitlines())}
            pil = pil_times(files, r)
            print(f"\n{name}: {len(files)} JPEGs, {r} rounds, microseconds per image (1 core)")
            print(f"  {'':22s} {'stoker':>9s} {'PIL/tv':>9s} {'PIL/stoker':>10s}")
            for k in ("full_decode_us", "imagenet_train_us", "rrc_us", "imagenet_val_us", "resize_us"):
                print(f"  {k:22s} {ours[k]:9.1f} {pil[k]:9.1f} {pil[k] / ours[k]:9.2f}x")
            print(f"  stoker imagenet-train vs stoker full decode: {ours['full_decode_us'] / ours['imagenet_train_us']:.2f}x the images/s")


if __name__ == "__main__":
    main()
