#!/usr/bin/python3
"""Writes the seed corpus of fuzz_tfrecord (tests/fuzz/corpus/tfrecord/):
each seed is the bytes of one TFRecord file (fuzz_tfrecord.c). From the
fixtures (../shared/fixtures/tfrecord/plain, Examples serialized by protobuf
from TensorFlow's .proto files): whole records copied as they are, the
smallest ones, so seeds stay under libFuzzer's 64 KiB; a copy cut inside a
record, and one with a damaged length CRC. Plus small Examples encoded here
with unpacked int64 and float values (protobuf's non-packed form, which the
fixtures lack)."""
import os, struct, sys

fx = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../shared/fixtures/tfrecord")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus/tfrecord")
os.makedirs(out, exist_ok=True)

def crc32c(data):
    c = 0xffffffff
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82f63b78 if c & 1 else c >> 1
    return c ^ 0xffffffff

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff

def frame(data):
    h = struct.pack("<Q", len(data))
    return h + struct.pack("<I", masked(h)) + data + struct.pack("<I", masked(data))

def records(path):
    b = open(path, "rb").read()
    at, out_ = 0, []
    while at < len(b):
        n = struct.unpack_from("<Q", b, at)[0]
        out_.append(b[at:at + 16 + n])
        at += 16 + n
    return out_

recs = sorted(records(os.path.join(fx, "plain/train-00000-of-00002.tfrecord")), key=len)
def seed(name, data):
    assert len(data) <= 65536, name
    open(os.path.join(out, name), "wb").write(data)

seed("plain-one", recs[0])
seed("plain-two", recs[0] + recs[1])
seed("plain-cut", recs[0] + recs[1][:len(recs[1]) // 2])
bad = bytearray(recs[0] + recs[1])
bad[len(recs[0]) + 9] ^= 0xff
seed("plain-lencrc", bytes(bad))

def varint(v):
    v &= (1 << 64) - 1
    o = b""
    while v >= 0x80:
        o += bytes([v & 0x7f | 0x80])
        v >>= 7
    return o + bytes([v])

def ld(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data

def feature(name, kind, body):
    return ld(1, ld(1, name.encode()) + ld(2, ld(kind, body)))

ex = b""
for r in range(3):
    feats = (feature("label", 3, varint(1 << 3) + varint(r)) +
             feature("vec", 2, b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in (1.5, -2.0))) +
             feature("neg", 3, ld(1, varint(-5) + varint(7))) +
             feature("image", 1, ld(1, b"\xff\xd8\xff") + ld(1, b"two")) +
             feature("empty", 1, b""))
    ex += frame(ld(1, feats))
seed("written-unpacked", ex)
