#!/usr/bin/python3
"""Builds a CLIP-style WebDataset tar set (samples with several fields) from the
photographs scripts/make-dataset.py uses (Debian's mate-backgrounds), and a
manifest of what every sample holds, for tests and benchmarks to compare with.

Each sample is a run of tar members sharing a key (WebDataset's convention):

  KEY.jpg      a random window of one photograph, resized, sharpened and
               encoded as make-dataset.py's "web" kind does (q85-90, 4:2:0)
  KEY.seg.png  a second image: a 4-class mask of the same window at half
               size (luminance quartiles), PNG in mode P (palette) or L
  KEY.txt      a caption: unique UTF-8 with non-ASCII text (accents, Greek,
               CJK, an emoji), 3 to 30 words
  KEY.json     nested metadata: the photo, the crop box, tags, a score, null
  KEY.cls      the class (the photograph's index), ASCII decimal
  KEY.npy      a float32 array of shape (8,): crop box, mean RGB, score

Members are written in that order; keys are PREFIX + 8 digits (the sample's
index in the dataset); shards hold --shard-size samples each and are named
mm-000000.tar, ... (read in name order, that is dataset order). Everything is
deterministic for a seed (tar headers carry a fixed mtime, owner and mode).

OUT/manifest.json lists the shards (name, samples, bytes, sha256) and, for
every sample in dataset order, its key, shard, label and each member's byte
offset and size in the tar, its sha256 and what it holds: the text of .txt,
the parsed value of .json and .cls, dtype, shape and values of .npy, width,
height and mode of images. Tests compare delivered fields with it byte for
byte; load it with load_manifest(OUT) and read a member's bytes with
member_bytes(OUT, sample, ext).

From Python (the file name has a dash, so import it by path):

    spec = importlib.util.spec_from_file_location("make_multimodal", PATH)
    mm = importlib.util.module_from_spec(spec); spec.loader.exec_module(mm)
    manifest = mm.make(out_dir, samples=40, shard_size=10, image_side=(48, 80))

usage: make-multimodal.py OUT [--samples N] [--shard-size N] [--seed S]
                          [--side MIN,MAX] [--seg-mode P|L] [--classes N]
                          [--drop EXT:K] [--key-prefix P]
"""
import argparse
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tarfile

import numpy as np
from PIL import Image, ImageFilter

PHOTO_DIRS = ["/usr/share/backgrounds/mate/nature", "/usr/share/backgrounds/mate/abstract"]
MTIME = 1700000000  # fixed, so the tars are byte-identical for a seed
ORDER = ["jpg", "seg.png", "txt", "json", "cls", "npy"]
KINDS = {"jpg": "image", "seg.png": "image", "txt": "text", "json": "json", "cls": "int",
         "npy": "npy"}

ADJECTIVES = ["quiet", "bright", "misty", "golden", "naïve", "crème-colored", "weiß",
              "zielony", "ελαφρύ", "静かな", "dunkel", "señorial", "ljus", "tiny", "wide"]
NOUNS = ["meadow", "façade", "café", "fjord", "Straße", "jalapeño", "smörgåsbord",
         "θάλασσα", "山", "forêt", "łąka", "río", "dune", "ladybird", "raindrop"]
EXTRAS = ["🌿", "☀️", "—", "«vue»", "„Bild“", "№", "½", "µm", "東京", "Ελλάδα", "Ωmega",
          "über", "coöperate", "déjà vu", "piñata"]
TAGS = ["nature", "macro", "texture", "sky", "water", "plant", "sand", "wood", "insect",
        "abstract", "dépaysement", "日本"]


def sources():
    """The photographs, in make-dataset.py's order (one class each)."""
    files = []
    if os.path.isdir(PHOTO_DIRS[0]):
        files = sorted(os.path.join(PHOTO_DIRS[0], f) for f in os.listdir(PHOTO_DIRS[0])
                       if f.endswith(".jpg"))
    files += [os.path.join(PHOTO_DIRS[1], "Elephants.jpg")]
    files = [f for f in files if os.path.exists(f)]
    if not files:
        sys.exit("make-multimodal: no photographs found; install Debian's mate-backgrounds "
                 "(scripts/install-deps.sh does)")
    return files


def _sha(b):
    return hashlib.sha256(b).hexdigest()


def _photo(cache, path, max_side):
    """The photograph decoded once, at the smallest JPEG scale that still
    covers 3x the largest output side (decoding full size dominates small
    test sets otherwise; the scale is deterministic)."""
    if path not in cache:
        im = Image.open(path)
        w, h = im.size
        im.draft("RGB", (max(w // 8, max_side * 3), max(h // 8, max_side * 3 * h // w)))
        cache[path] = im.convert("RGB")
    return cache[path]


def _window(rng, src, side):
    """A random window of the photo resized to a random size, as
    make-dataset.py's "web" kind makes them; returns the image and the crop
    box (x, y, w, h) in the photo's pixels, and whether it was flipped."""
    W, H = src.size
    lo, hi = side
    tw, th = rng.randint(lo, hi), rng.randint(lo * 13 // 15, hi * 13 // 15)
    scale = rng.uniform(0.35, 1.0)
    cw = min(W, max(int(W * scale), 16))
    ch = min(H, max(int(cw * th / tw), 16))
    cw = min(W, int(ch * tw / th))
    x, y = rng.randint(0, W - cw), rng.randint(0, H - ch)
    im = src.crop((x, y, x + cw, y + ch)).resize((tw, th), Image.BILINEAR, reducing_gap=None)
    flip = rng.random() < 0.5
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    im = im.filter(ImageFilter.UnsharpMask(radius=1, percent=320, threshold=0))
    return im, (x, y, cw, ch), flip


def _seg(im, mode):
    """A 4-class mask of the image at half size: luminance quartiles."""
    small = im.resize((max(im.width // 2, 1), max(im.height // 2, 1)), Image.BILINEAR)
    mask = small.convert("L").point(lambda v: v * 4 // 256)
    if mode == "L":
        return mask.point(lambda v: v * 85)  # 0, 85, 170, 255: visible
    pal = mask.convert("P")
    pal.putpalette([0, 0, 0, 230, 25, 75, 60, 180, 75, 0, 130, 200] + [0] * (256 - 4) * 3)
    return pal


def _caption(rng, key, photo):
    words = [rng.choice(ADJECTIVES), rng.choice(NOUNS)]
    words += [rng.choice(ADJECTIVES + NOUNS + EXTRAS) for _ in range(rng.randint(1, 28))]
    stem = os.path.splitext(os.path.basename(photo))[0]
    # The key makes every caption unique.
    return "a photo of %s (%s), n° %s: %s" % (stem, rng.choice(EXTRAS), key, " ".join(words))


def _png(im):
    b = io.BytesIO()
    im.save(b, "PNG", optimize=False)
    return b.getvalue()


def _sample(rng, cache, photos, side, seg_mode, index, key):
    """One sample's members {ext: bytes} and the manifest's per-member facts."""
    label = rng.randrange(len(photos))
    src = _photo(cache, photos[label], side[1])
    im, (x, y, cw, ch), flip = _window(rng, src, side)
    b = io.BytesIO()
    im.save(b, "JPEG", quality=rng.randint(85, 90), subsampling=2)
    jpg = b.getvalue()
    seg = _seg(im, seg_mode)
    caption = _caption(rng, key, photos[label])
    score = round(rng.uniform(3.0, 8.0), 4)
    mean = [round(float(v), 4) for v in np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) / 255]
    W, H = src.size
    meta = {
        "key": key,
        "index": index,
        "photo": {"file": os.path.basename(photos[label]), "size": [W, H], "class": label},
        "crop": {"x": x, "y": y, "w": cw, "h": ch, "flip": flip},
        "image": {"width": im.width, "height": im.height},
        "tags": sorted(rng.sample(TAGS, rng.randint(1, 4))),
        "aesthetic": score,
        "nested": {"level": 1, "next": {"level": 2, "list": [1, 2.5, "drei", None, True]}},
        "license": None,
    }
    arr = np.array([x / W, y / H, cw / W, ch / H] + mean + [score / 10], dtype=np.float32)
    nb = io.BytesIO()
    np.save(nb, arr, allow_pickle=False)
    data = {
        "jpg": jpg,
        "seg.png": _png(seg),
        "txt": caption.encode("utf-8"),
        "json": json.dumps(meta, ensure_ascii=False, sort_keys=True).encode("utf-8"),
        "cls": str(label).encode("ascii"),
        "npy": nb.getvalue(),
    }
    facts = {
        "jpg": {"width": im.width, "height": im.height, "mode": "RGB"},
        "seg.png": {"width": seg.width, "height": seg.height, "mode": seg.mode},
        "txt": {"text": caption},
        "json": {"value": meta},
        "cls": {"value": label},
        "npy": {"dtype": "float32", "shape": list(arr.shape), "values": arr.tolist()},
    }
    return label, data, facts


def _parse_drop(drop):
    """{ext: K}: the member ext is left out of every K-th sample (index % K == K-1)."""
    out = {}
    for ext, k in (drop or {}).items():
        if ext not in KINDS or int(k) < 1:
            raise ValueError("drop: %r:%r (exts: %s; K >= 1)" % (ext, k, ", ".join(ORDER)))
        out[ext] = int(k)
    return out


def make(out, samples=1000, shard_size=125, seed=1, image_side=(300, 500), seg_mode="P",
         classes=10, drop=None, key_prefix="", progress=False):
    """Writes the shards and OUT/manifest.json (OUT must not exist yet; it is
    built as OUT.partial and renamed, so a half-made set is never taken for
    a whole one). Returns the manifest."""
    if seg_mode not in ("P", "L"):
        raise ValueError("seg_mode: P or L")
    if samples < 1 or shard_size < 1:
        raise ValueError("samples and shard_size must be >= 1")
    drop = _parse_drop(drop)
    photos = sources()[:classes]
    rng = random.Random(seed)
    cache = {}
    out = os.fspath(out)
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    manifest = {"version": 1, "generator": "scripts/make-multimodal.py", "seed": seed,
                "samples": [], "shards": [], "kinds": KINDS, "order": ORDER,
                "seg_mode": seg_mode, "image_side": list(image_side), "drop": drop,
                "classes": len(photos)}
    for s0 in range(0, samples, shard_size):
        name = "mm-%06d.tar" % (s0 // shard_size)
        path = os.path.join(tmp, name)
        rows = []
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(s0, min(samples, s0 + shard_size)):
                key = "%s%08d" % (key_prefix, i)
                label, data, facts = _sample(rng, cache, photos, image_side, seg_mode, i, key)
                members = {}
                for ext in ORDER:
                    if ext in drop and i % drop[ext] == drop[ext] - 1:
                        continue
                    b = data[ext]
                    ti = tarfile.TarInfo(key + "." + ext)
                    ti.size, ti.mtime, ti.mode = len(b), MTIME, 0o644
                    ti.uid = ti.gid = 0
                    ti.uname = ti.gname = ""
                    tf.addfile(ti, io.BytesIO(b))
                    members[ext] = dict(size=len(b), sha256=_sha(b), **facts[ext])
                rows.append({"key": key, "index": i, "shard": name, "label": label,
                             "fields": members})
                if progress:
                    print("\rmake-multimodal: %d/%d samples" % (i + 1, samples), end="",
                          file=sys.stderr)
        # Offsets as a reader sees them: read back, which also checks the tar.
        with tarfile.open(path) as tf:
            where = {m.name: m.offset_data for m in tf.getmembers()}
        for r in rows:
            for ext, m in r["fields"].items():
                m["offset"] = where[r["key"] + "." + ext]
        with open(path, "rb") as f:
            blob = f.read()
        manifest["shards"].append({"name": name, "samples": len(rows), "bytes": len(blob),
                                   "sha256": _sha(blob)})
        manifest["samples"] += rows
    if progress:
        print(file=sys.stderr)
    with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, out)
    return manifest


def load_manifest(out):
    with open(os.path.join(os.fspath(out), "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def member_bytes(out, sample, ext):
    """The bytes of member ext of a manifest sample, read at its offset."""
    m = sample["fields"][ext]
    with open(os.path.join(os.fspath(out), sample["shard"]), "rb") as f:
        f.seek(m["offset"])
        return f.read(m["size"])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--shard-size", type=int, default=125, help="samples per shard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--side", default="300,500", help="MIN,MAX width of the .jpg images")
    ap.add_argument("--seg-mode", default="P", choices=["P", "L"])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--drop", action="append", default=[], metavar="EXT:K",
                    help="leave member EXT out of every K-th sample (repeatable)")
    ap.add_argument("--key-prefix", default="", help="e.g. 'part.1/' (a directory with a dot)")
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit("make-multimodal: %s exists" % a.out)
    lo, hi = (int(v) for v in a.side.split(","))
    drop = {}
    for d in a.drop:
        ext, _, k = d.rpartition(":")
        drop[ext] = int(k)
    m = make(a.out, a.samples, a.shard_size, a.seed, (lo, hi), a.seg_mode, a.classes, drop,
             a.key_prefix, progress=sys.stderr.isatty())
    total = sum(s["bytes"] for s in m["shards"])
    print("make-multimodal: wrote %d samples in %d shards (%.1f MiB) to %s" %
          (len(m["samples"]), len(m["shards"]), total / 2**20, a.out))


if __name__ == "__main__":
    main()
