"""Image pipelines through stoker.Loader (these need the engine's image
module: src/image.c, src/codec, src/ops), and the example's correctness."""

import collections
import importlib.util
import os

import numpy as np
import pytest
import torch
import torchvision.datasets as D
import torchvision.transforms as TV
from PIL import Image

import stoker
from stoker import transforms as T

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLORS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory):
    """3 classes x 8 JPEGs of varying sizes: a class colour plus noise."""
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for c, col in enumerate(COLORS):
        d = root / f"c{c}"
        d.mkdir()
        for k in range(8):
            h, w = 40 + 3 * k, 70 - 2 * k
            img = np.clip(np.array(col) + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(d / f"i{k}.jpg", quality=90)
    return root


def first(loader):
    with loader:
        return next(iter(loader))


def test_presets_give_dense_uint8_nchw(jpeg_folder):
    x, y = first(stoker.Loader(jpeg_folder, 6, transform="imagenet-train", size=32))
    assert x.shape == (6, 3, 32, 32) and x.dtype == torch.uint8 and y.dtype == torch.int64
    x, y = first(stoker.Loader(jpeg_folder, 6, transform="imagenet-val", size=24,
                               output="numpy", layout="nhwc"))
    assert x.shape == (6, 24, 24, 3) and x.dtype == np.uint8
    x, y = first(stoker.Loader(jpeg_folder, 4, transform="cifar-train"))
    assert x.shape == (4, 3, 32, 32)


def test_decode_gives_per_image_hwc_arrays_equal_to_pil(jpeg_folder):
    with stoker.Loader(jpeg_folder, 5, transform="decode", output="numpy", shuffle=False,
                       return_indices=True) as L:
        ds = D.ImageFolder(jpeg_folder)
        for xs, ys, idx in L:
            for a, label, i in zip(xs, ys, idx):
                path, want_label = ds.samples[i]
                want = np.asarray(Image.open(path).convert("RGB"))
                assert label == want_label and a.shape == want.shape
                assert np.abs(a.astype(int) - want).mean() < 1.0


@pytest.mark.parametrize("dtype,tdtype", [("float32", torch.float32),
                                          ("float16", torch.float16),
                                          ("bfloat16", torch.bfloat16)])
def test_normalize_matches_torchvision(jpeg_folder, dtype, tdtype):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ours = [T.Resize(36), T.CenterCrop(32), T.Normalize(mean, std)]
    tv = TV.Compose([TV.Resize(36), TV.CenterCrop(32), TV.ToTensor(), TV.Normalize(mean, std)])
    ds = D.ImageFolder(jpeg_folder, transform=tv)
    with stoker.Loader(jpeg_folder, 8, transform=ours, dtype=dtype, shuffle=False) as L:
        x, y = next(iter(L))
    assert x.dtype == tdtype and x.shape == (8, 3, 32, 32)
    want = torch.stack([ds[i][0] for i in range(8)])
    assert (x.float() - want).abs().mean() < 0.03


def test_numpy_float16_and_no_bfloat16(jpeg_folder):
    x, _ = first(stoker.Loader(jpeg_folder, 2, transform="imagenet-val", size=16,
                               dtype="float16", output="numpy"))
    assert x.dtype == np.float16
    with pytest.raises(ValueError, match="bfloat16"):
        stoker.Loader(jpeg_folder, 2, transform="imagenet-val", dtype="bfloat16",
                      output="numpy")


def test_compose_list_torchvision_and_string_agree(jpeg_folder):
    spec = "RandomResizedCrop(24,scale=(0.5,1.0),ratio=(0.75,1.3333333333333333))|" \
           "RandomHorizontalFlip(p=0.5)"
    forms = [spec,
             [T.RandomResizedCrop(24, scale=(0.5, 1.0)), T.RandomHorizontalFlip()],
             T.Compose([T.RandomResizedCrop(24, scale=(0.5, 1.0)), T.RandomHorizontalFlip()]),
             TV.Compose([TV.RandomResizedCrop(24, scale=(0.5, 1.0)), TV.RandomHorizontalFlip(),
                         TV.PILToTensor()])]
    outs = []
    for f in forms:
        with stoker.Loader(jpeg_folder, 24, transform=f, seed=5, output="numpy") as L:
            outs.append(np.array(next(iter(L))[0]))
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)


def test_engine_rejects_bad_spec_with_its_reason(jpeg_folder):
    with pytest.raises(ValueError, match="Normalize"):
        stoker.Loader(jpeg_folder, 2, transform="Normalize(mean=(0.5,),std=(0.5,))|Resize(8)")


def test_image_batches_identical_for_any_thread_count(jpeg_folder):
    runs = []
    for threads in (1, 2, 3):
        with stoker.Loader(jpeg_folder, 5, transform="imagenet-train", size=20, seed=42,
                           threads=threads, output="numpy") as L:
            runs.append([(np.array(x), np.array(y)) for _ in range(2) for x, y in L])
    for other in runs[1:]:
        for (a, la), (b, lb) in zip(runs[0], other):
            assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_state_dict_carries_the_transform_fingerprint(jpeg_folder):
    with stoker.Loader(jpeg_folder, 6, transform="imagenet-train", size=16, seed=1,
                       output="numpy") as L:
        it = iter(L)
        next(it)
        sd = L.state_dict()
    assert isinstance(sd["transform_hash"], int)
    # Another transform, or the same one with another size: refused, naming it.
    for kw in (dict(transform="imagenet-val", size=16), dict(transform="imagenet-train", size=24)):
        with stoker.Loader(jpeg_folder, 6, seed=1, output="numpy", **kw) as L:
            with pytest.raises(ValueError, match="transform"):
                L.load_state_dict(sd)
    # A state dict saved before the fingerprint existed loads (documented rule:
    # fingerprint keys it lacks are not checked).
    old = {k: v for k, v in sd.items() if k != "transform_hash"}
    with stoker.Loader(jpeg_folder, 6, transform="imagenet-val", size=16, seed=1,
                       output="numpy") as L:
        L.load_state_dict(old)
        assert L.state_dict()["batch"] == 1


def test_random_transforms_differ_per_epoch_and_resume_exactly(jpeg_folder):
    with stoker.Loader(jpeg_folder, 6, transform="imagenet-train", size=16, seed=1,
                       output="numpy") as L:
        e0 = [np.array(x) for x, _ in L]
        it = iter(L)
        next(it)
        sd = L.state_dict()
        rest = [np.array(x) for x, _ in it]
    with stoker.Loader(jpeg_folder, 6, transform="imagenet-train", size=16, seed=1,
                       output="numpy", threads=1) as L:
        L.load_state_dict(sd)
        got = [np.array(x) for x, _ in L]
    assert all(np.array_equal(a, b) for a, b in zip(rest, got)) and len(got) == len(rest)
    assert not all(np.array_equal(a, b) for a, b in zip(e0[1:], rest))


def test_corrupt_image_named_under_raise_and_counted_under_skip(jpeg_folder, tmp_path):
    root = tmp_path / "bad"
    for c in ("c0", "c1"):
        (root / c).mkdir(parents=True)
        for k in range(3):
            (root / c / f"i{k}.jpg").write_bytes((jpeg_folder / c / f"i{k}.jpg").read_bytes())
    good = (root / "c1" / "i1.jpg").read_bytes()
    (root / "c1" / "i1.jpg").write_bytes(good[:len(good) // 3])       # truncated
    (root / "c0" / "i2.jpg").write_bytes(b"this is not an image at all")
    with stoker.Loader(root, 6, transform="imagenet-val", size=16, shuffle=False) as L:
        it = iter(L)
        with pytest.raises(stoker.SampleError) as e:
            next(it)
        paths = sorted(err["path"] for err in e.value.errors)
        assert paths == [str(root / "c0" / "i2.jpg"), str(root / "c1" / "i1.jpg")]
        assert "i2.jpg" in str(e.value) and e.value.reason
        x, y = next(it)
        assert x.shape[0] == 4 and y.tolist() == [0, 0, 1, 1]
    with stoker.Loader(root, 6, transform="imagenet-val", size=16, on_error="skip") as L:
        assert sum(len(y) for _, y in L) == 4
        assert L.stats()["samples_skipped"] == 2


def test_strict_fails_a_truncated_jpeg_in_every_epoch(tmp_path):
    (tmp_path / "c0").mkdir()
    rng = np.random.default_rng(0)
    px = (np.arange(64)[None, :, None] + rng.integers(0, 64, (512, 64, 3))).astype(np.uint8)
    path = tmp_path / "c0" / "cut.jpg"
    Image.fromarray(px).save(path, quality=90)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 7 // 10])
    # The centre crop never reaches the cut: by default the sample decodes.
    with stoker.Loader(tmp_path, 1, transform="CenterCrop(32)", output="numpy") as L:
        for _ in range(2):
            assert [len(y) for _, y in L] == [1]
    with stoker.Loader(tmp_path, 1, transform="CenterCrop(32)", output="numpy",
                       strict=True, on_error="skip") as L:
        for _ in range(2):
            assert [len(y) for _, y in L] == [0]
            assert "Premature end" in L.stats()["errors"][0]["reason"]


# ---- the example -------------------------------------------------------------------

def load_example():
    spec = importlib.util.spec_from_file_location(
        "train_cnn", os.path.join(ROOT, "examples", "train_cnn.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_loaders_deliver_the_same_samples(jpeg_folder):
    ex = load_example()
    dl = ex.dataloader(str(jpeg_folder), 5, 16, workers=0)
    dl_labels, dl_shapes = collections.Counter(), set()
    for x, y in dl:
        dl_labels.update(y.tolist())
        dl_shapes.add((tuple(x.shape[1:]), x.dtype))
    epoch_indices = [i for b in dl.batch_sampler for i in b]
    with ex.stoker_loader(str(jpeg_folder), 5, 16) as L:
        st_labels, st_shapes = collections.Counter(), set()
        for x, y in L:
            st_labels.update(y.tolist())
            st_shapes.add((tuple(x.shape[1:]), x.dtype))
        assert len(L) == len(dl)
    assert st_labels == dl_labels and st_shapes == dl_shapes == {((3, 16, 16), torch.uint8)}
    # sample by sample: each index once per epoch, with ImageFolder's label
    ds = dl.dataset
    with stoker.Loader(str(jpeg_folder), 5, transform="imagenet-train", size=16,
                       return_indices=True) as L:
        for _ in range(2):
            idx, labels = [], []
            for _, y, i in L:
                idx += i.tolist()
                labels += y.tolist()
            assert sorted(idx) == sorted(epoch_indices) == list(range(len(ds)))
            assert labels == [ds.samples[i][1] for i in idx]


def test_example_training_loss_goes_down(jpeg_folder):
    ex = load_example()
    with ex.stoker_loader(str(jpeg_folder), 8, 16) as L:
        losses = ex.train(L, L.num_classes, epochs=5, device="cpu", lr=0.05,
                          log=lambda *_: None)
    assert losses[-1] < losses[0] * 0.7, losses
