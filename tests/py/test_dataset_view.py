"""What DataLoader code reaches for on a loader (issue 13, item 9):
loader.dataset (len = samples, classes, class_to_idx) and loader.sampler
(len = samples of this rank per epoch, set_epoch)."""

import os
import subprocess

import pytest

import stoker
from conftest import stoker_bin  # noqa: E402


def test_dataset_len_and_classes_as_imagefolder(make_folder):
    root = make_folder(classes=3, per_class=5)
    with stoker.Loader(root, 4, output="numpy", rank=1, world_size=2) as L:
        ds = L.dataset
        assert len(ds) == 15                      # the whole dataset, not this rank's share
        assert ds.classes == ["class00", "class01", "class02"]
        assert ds.class_to_idx == {"class00": 0, "class01": 1, "class02": 2}
        assert ds.num_classes == 3 and ds.kind == "folder"
        assert ds.root == os.fspath(root) and ds.source is root
        assert "15 samples" in repr(ds)
        with pytest.raises(TypeError, match="iterate the loader"):
            ds[0]
        # The usual averaging over the dataset adds up.
        seen = sum(len(y) for _, y in L)
        assert seen == L.samples_per_epoch == 8


def test_sampler_len_and_set_epoch_as_distributed_sampler(make_folder):
    root = make_folder(classes=3, per_class=5)
    with stoker.Loader(root, 4, output="numpy", rank=1, world_size=2, seed=5) as L:
        s = L.sampler
        assert len(s) == 8                        # ceil(15 / 2), padded as DistributedSampler
        assert (s.rank, s.num_replicas, s.shuffle, s.seed, s.drop_last) == (1, 2, True, 5, False)
        s.set_epoch(3)
        assert s.epoch == L.epoch == 3
        first3 = [y.tolist() for _, y in L]
    with stoker.Loader(root, 4, output="numpy", rank=1, world_size=2, seed=5) as L:
        L.set_epoch(3)
        assert [y.tolist() for _, y in L] == first3
    with stoker.Loader(root, 4, output="numpy", rank=0, world_size=2, drop_last=True) as L:
        # floor(15 / 2) = 7 samples, in whole batches: the samples delivered.
        assert len(L.sampler) == L.samples_per_epoch == 4 and len(L.dataset) == 15


def test_records_dataset(make_records):
    with stoker.Loader(make_records(10), 4, output="numpy") as L:
        assert len(L.dataset) == 10 and L.dataset.classes == [] and L.dataset.kind == "records"
        assert len(L.sampler) == 10


def test_classes_of_a_single_file_source_does_not_fail(tmp_path):
    """A CIFAR batch file (not a directory) names no classes; listing it as a
    directory used to raise NotADirectoryError."""
    rec = bytearray()
    for i in range(4):
        rec += bytes([i % 10]) + bytes(3072)
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(bytes(rec) * 2500)           # CIFAR-10 batches hold 10000 records
    with stoker.Loader(path, 4, output="numpy") as L:
        assert L.dataset.kind == "cifar" and len(L.dataset) == 10000
        assert L.classes == [] and L.dataset.classes == []


@pytest.mark.skipif(stoker_bin() is None, reason="no stoker binary (build it or set STOKER_BIN)")
def test_classes_of_a_packed_dataset_come_from_its_manifest(make_folder, tmp_path):
    from PIL import Image
    src = make_folder(classes=3, per_class=2)
    # pack checks that files named .jpg are images: make them real JPEGs.
    for f in src.rglob("*.jpg"):
        Image.new("RGB", (8, 6), (len(f.name) * 9 % 256, 40, 90)).save(f, "JPEG")
    os.rename(src / "class01", src / "zebra \N{SNOWMAN}")
    out = tmp_path / "packed"
    r = subprocess.run([stoker_bin(), "pack", str(src), str(out), "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with stoker.Loader(src, 2, output="numpy") as a, stoker.Loader(out, 2, output="numpy") as b:
        assert b.dataset.kind == "stk"
        assert b.classes == a.classes == ["class00", "class02", "zebra \N{SNOWMAN}"]
        assert len(b.dataset) == len(a.dataset) == 6
