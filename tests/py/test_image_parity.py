"""Parity of stoker's image pipeline with PIL / torchvision 0.14.

Builds tests/c/image_dump_main.c (plus the library's image sources) with one
gcc line into a temporary directory, runs it on images made from the photos
in /usr/share/backgrounds/mate/nature, and compares with what PIL and
torchvision produce from the same files.

Run from the repository root:  /usr/bin/python3 -m pytest tests/py/test_image_parity.py
"""
import glob
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="PIL (python3-pil) is needed for reference decodes")
from PIL import Image  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PHOTOS = sorted(glob.glob("/usr/share/backgrounds/mate/nature/*.jpg"))
needs_photos = pytest.mark.skipif(
    not PHOTOS, reason="no photographs in /usr/share/backgrounds/mate/nature (package mate-backgrounds)")


@pytest.fixture(scope="session")
def dump(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed: cannot build the dump tool")
    d = tmp_path_factory.mktemp("imgdump")
    exe = str(d / "image_dump")
    srcs = (["src/alloc.c", "src/image.c"] + sorted(glob.glob(os.path.join(ROOT, "src/codec/*.c"))) +
            sorted(glob.glob(os.path.join(ROOT, "src/ops/*.c"))) + ["tests/c/image_dump_main.c"])
    cmd = ["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Iinclude", "-Isrc", *srcs,
           "-ljpeg", "-lspng", "-lm", "-o", exe]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        pytest.fail("building the dump tool failed:\n" + r.stderr)
    return exe


def run(exe, path, spec, seed=0, tmp=None, **kw):
    out = os.path.join(tmp or os.path.dirname(exe), "out.raw")
    args = [exe, str(path), spec, str(seed), out] + [f"{k}={v}" for k, v in kw.items()]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"{path} {spec}: {r.stdout.strip()} {r.stderr.strip()}")
    h, w, c, _ = map(int, r.stdout.split())
    return np.fromfile(out, dtype=np.uint8).reshape(h, w, c)


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="session")
def small_images(tmp_path_factory):
    """~400x350 versions of the photos in several encodings and colour types."""
    if not PHOTOS:
        pytest.skip("no photographs in /usr/share/backgrounds/mate/nature")
    d = tmp_path_factory.mktemp("imgs")
    files = {}
    for k, p in enumerate(PHOTOS[:4]):
        im = Image.open(p).convert("RGB").resize((400 + 7 * k, 350 - 5 * k), Image.BILINEAR)
        base = os.path.splitext(os.path.basename(p))[0]
        variants = {
            "q90_420.jpg": lambda f: im.save(f, quality=90),
            "q96_444.jpg": lambda f: im.save(f, quality=96, subsampling=0),
            "q85_422.jpg": lambda f: im.save(f, quality=85, subsampling=1),
            "progressive.jpg": lambda f: im.save(f, quality=88, progressive=True),
            "gray.jpg": lambda f: im.convert("L").save(f, quality=90),
            "cmyk.jpg": lambda f: im.convert("CMYK").save(f, quality=92),
            "rgb.png": lambda f: im.save(f),
            "rgba.png": lambda f: im.convert("RGBA").save(f),
            "l.png": lambda f: im.convert("L").save(f),
            "la.png": lambda f: im.convert("LA").save(f),
            "p.png": lambda f: im.convert("P", palette=Image.ADAPTIVE, colors=200).save(f),
            "p_trns.png": lambda f: im.convert("P", palette=Image.ADAPTIVE, colors=64).save(f, transparency=3),
            "1bit.png": lambda f: im.convert("1").save(f),
        }
        for name, save in variants.items():
            f = str(d / f"{base}_{name}")
            save(f)
            files.setdefault(name, []).append(f)
    return files


DECODE_KINDS = ["q90_420.jpg", "q96_444.jpg", "q85_422.jpg", "progressive.jpg", "gray.jpg", "cmyk.jpg",
                "rgb.png", "rgba.png", "l.png", "la.png", "p.png", "p_trns.png", "1bit.png"]


@needs_photos
@pytest.mark.parametrize("kind", DECODE_KINDS)
def test_decode_equals_pil(dump, small_images, kind):
    """A plain decode is bit-exact with PIL's open().convert("RGB")."""
    for f in small_images[kind]:
        ref = np.asarray(Image.open(f).convert("RGB"))
        got = run(dump, f, "decode")
        assert got.shape == ref.shape
        assert np.array_equal(got, ref), f"{f}: max diff {np.abs(got.astype(int) - ref).max()}"


def test_png_16bit_grey_differs_from_pil_as_documented(dump, tmp_path):
    """16-bit grey: PIL opens it as mode I and convert("RGB") clips to 255; we
    keep the high byte like PIL does for every other 16-bit PNG (docs/images.md)."""
    v = (np.arange(40 * 30, dtype=np.uint32).reshape(30, 40) * 53) % 65536
    f = str(tmp_path / "g16.png")
    Image.fromarray(v.astype(np.uint16)).save(f)
    got = run(dump, f, "decode")
    assert np.array_equal(got[..., 0], (v >> 8).astype(np.uint8))
    pil = np.asarray(Image.open(f).convert("RGB"))[..., 0]
    assert np.array_equal(pil, np.minimum(v, 255).astype(np.uint8))


def val_reference(path):
    import torchvision.transforms as T
    return np.asarray(T.Compose([T.Resize(256), T.CenterCrop(224)])(Image.open(path).convert("RGB")))


@needs_photos
def test_imagenet_val_matches_torchvision(dump):
    """imagenet-val (DCT-scaled, crop-aware) vs torchvision Resize(256)+CenterCrop(224)
    on the full-size photographs: mean |diff| <= 2 levels, PSNR >= 35 dB each."""
    pytest.importorskip("torchvision", reason="torchvision is needed for the reference pipeline")
    rows = []
    for p in PHOTOS:
        ref = val_reference(p)
        got = run(dump, p, "imagenet-val")
        assert got.shape == ref.shape == (224, 224, 3)
        mad = np.abs(got.astype(int) - ref).mean()
        q = psnr(got, ref)
        rows.append((os.path.basename(p), mad, q))
        assert mad <= 2.0 and q >= 35.0, f"{p}: mean abs diff {mad:.2f}, PSNR {q:.1f} dB"
    print("\nimagenet-val vs torchvision:")
    for name, mad, q in rows:
        print(f"  {name:20s} MAD {mad:.2f}  PSNR {q:.1f} dB")


@needs_photos
def test_imagenet_val_small_images_exact(dump, small_images):
    """Without DCT scaling (images under 2x the target), the windowed
    resample is bit-exact with torchvision."""
    pytest.importorskip("torchvision", reason="torchvision is needed for the reference pipeline")
    for f in small_images["q90_420.jpg"] + small_images["rgb.png"]:
        assert np.array_equal(run(dump, f, "imagenet-val"), val_reference(f))


def rrc_params(dump, w, h, n, seed):
    r = subprocess.run([dump, "--rrc", str(w), str(h), str(n), str(seed)], capture_output=True,
                       text=True, check=True)
    return [tuple(map(int, line.split())) for line in r.stdout.splitlines()]


@needs_photos
def test_random_resized_crop_matches_pil(dump, small_images):
    """RandomResizedCrop(224) equals PIL crop + resize(BILINEAR) with the same
    crop box: exactly on small images, >= 35 dB through DCT scaling on big ones."""
    for f in small_images["q90_420.jpg"][:2] + small_images["cmyk.jpg"][:1] + PHOTOS[:3]:
        im = Image.open(f).convert("RGB")
        params = rrc_params(dump, im.width, im.height, 6, 11)
        for k, (i, j, h, w, _fb) in enumerate(params):
            ref = np.asarray(im.crop((j, i, j + w, i + h)).resize((224, 224), Image.BILINEAR))
            got = run(dump, f, "RandomResizedCrop(224)", seed=11, sample=k)
            if f in PHOTOS:
                assert psnr(got, ref) >= 35.0, f"{f} sample {k}: {psnr(got, ref):.1f} dB"
            else:
                assert np.array_equal(got, ref), f"{f} sample {k}"


def ks_2samp(a, b):
    a, b = np.sort(a), np.sort(b)
    x = np.concatenate([a, b])
    fa = np.searchsorted(a, x, side="right") / len(a)
    fb = np.searchsorted(b, x, side="right") / len(b)
    return np.abs(fa - fb).max()


@pytest.mark.parametrize("size", [(400, 350), (500, 100), (224, 640)])
def test_rrc_distribution_matches_torchvision(dump, size):
    """Two-sample KS on area fraction and log aspect ratio, C sampler vs
    torchvision's RandomResizedCrop.get_params (alpha = 0.001)."""
    torch = pytest.importorskip("torch", reason="torch is needed for the reference sampler")
    from torchvision.transforms import RandomResizedCrop
    w, h = size
    n = 20000
    torch.manual_seed(1)
    img = Image.new("RGB", (w, h))
    ref = [RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)]
    ours = rrc_params(dump, w, h, n, 5)
    crit = 1.95 * math.sqrt(2.0 / n)
    for name, f in (("area", lambda ch, cw: cw * ch / (w * h)), ("log ratio", lambda ch, cw: math.log(cw / ch))):
        d = ks_2samp(np.array([f(p[2], p[3]) for p in ref]), np.array([f(p[2], p[3]) for p in ours]))
        assert d < crit, f"{size} {name}: KS distance {d:.4f} >= {crit:.4f}"
    # Offsets are uniform over the valid range in both.
    off_ref = np.array([p[0] / max(1, h - p[2]) for p in ref if h > p[2]])
    off_us = np.array([p[0] / max(1, h - p[2]) for p in ours if h > p[2]])
    if len(off_ref) > 1000 and len(off_us) > 1000:
        crit_o = 1.95 * math.sqrt((len(off_ref) + len(off_us)) / (len(off_ref) * len(off_us)))
        assert ks_2samp(off_ref, off_us) < crit_o
