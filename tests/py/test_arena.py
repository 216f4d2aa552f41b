"""Variable-size batches without a per-slot budget (docs/memory.md): a photo
folder with a large image decodes with the defaults, pixels equal to PIL's;
raw files of several MB load with the defaults; batch_memory too small for a
sample is an error with the numbers; the memory bound counts batch_memory
once per ring buffer."""

import numpy as np
import pytest

import stoker


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from PIL import Image
    root = tmp_path_factory.mktemp("arena") / "photos"
    rng = np.random.default_rng(1)
    for k in range(6):
        d = root / ("a" if k % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        h, w = (2000, 3000) if k == 3 else (60 + 10 * k, 80 + 7 * k)
        base = rng.integers(0, 256, size=(h // 50 + 1, w // 50 + 1, 3), dtype=np.uint8)
        img = np.kron(base, np.ones((50, 50, 1), dtype=np.uint8))[:h, :w]
        Image.fromarray(img).save(d / f"p{k}.jpg", quality=90)
    return root


def test_decode_large_photo_with_defaults(photos):
    from PIL import Image
    ds = stoker.Loader(photos, 3, transform="decode", output="numpy", shuffle=False, threads=2)
    paths = sorted(p for p in photos.rglob("*.jpg"))
    seen = 0
    for images, labels in ds:
        for img in images:
            want = np.asarray(Image.open(paths[seen]).convert("RGB"))
            assert img.shape == want.shape
            assert np.array_equal(img, want)
            seen += 1
    assert seen == 6
    assert any(p.name == "p3.jpg" for p in paths)


def test_raw_files_of_megabytes_with_defaults(tmp_path):
    root = tmp_path / "raw" / "x"
    root.mkdir(parents=True)
    sizes = [3 << 20, 10, 0, 1 << 20, 777]
    for k, n in enumerate(sizes):
        (root / f"f{k}.jpg").write_bytes(bytes((j * 3 + k) % 256 for j in range(n)) if n < 4096
                                         else (np.arange(n, dtype=np.uint64) * 3 + k)
                                         .astype(np.uint8).tobytes())
    with stoker.Loader(tmp_path / "raw", 5, output="numpy", shuffle=False, threads=2) as L:
        (samples, _), = list(L)
        assert [len(s) for s in samples] == sizes
        for k, s in enumerate(samples):
            want = (np.arange(len(s), dtype=np.uint64) * 3 + k).astype(np.uint8)
            assert np.array_equal(s, want)


def test_batch_memory_too_small_names_the_numbers(photos):
    with stoker.Loader(photos, 6, transform="decode", output="numpy", shuffle=False,
                       options={"batch_memory": "8M"}) as L:
        with pytest.raises(stoker.SampleError, match=r"p3\.jpg.*18000000 bytes, more than "
                                                     r"batch_memory \(8388608 bytes\)"):
            next(iter(L))


def test_bound_counts_batch_memory(photos):
    bounds = []
    for bm in ("32M", "64M"):
        with stoker.Loader(photos, 256, transform="decode", output="numpy", depth=2,
                           options={"batch_memory": bm}) as L:
            bounds.append(L.memory_bound)
    assert bounds[1] - bounds[0] == 3 * (32 << 20)
    with pytest.raises(ValueError, match="batch_memory"):
        stoker.Loader(photos, 4, transform="decode", options={"batch_memory": "1K"})
