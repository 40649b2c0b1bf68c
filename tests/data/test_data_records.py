"""The indexed record file: round trips, random access, sharding, and that every corruption and
every truncation is reported (never skipped)."""

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.data import records as rec
from mlsys_lab.data.pipeline import Pipeline
from mlsys_lab.data.records import (
    RecordError,
    RecordFile,
    RecordWriter,
    decode_payload,
    encode_payload,
    read_shard,
    write_sharded,
)
from mlsys_lab.errors import ArgumentError, MLSysError

DTYPES = ["uint8", "int32", "int64", "float32", "float64", "bool", "complex64", "<U3"]


def write(path, items, metadata=None):
    with RecordWriter(path, metadata) as writer:
        for item in items:
            writer.write(item)
    return path


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 200, shape).astype(dtype),
    st.sampled_from(DTYPES), st.lists(st.integers(0, 4), max_size=3), st.integers(0, 99))
values = st.one_of(arrays, st.binary(max_size=20), st.integers(-2**40, 2**40),
                   st.floats(allow_nan=False), st.text(max_size=5), st.booleans(), st.none())
record_values = st.one_of(st.binary(max_size=40),
                          st.dictionaries(st.text(min_size=1, max_size=4), values, max_size=4))


@settings(max_examples=40, deadline=None)
@given(st.lists(record_values, max_size=6))
def test_round_trip_in_order_and_by_index(tmp_path_factory, items):
    path = write(tmp_path_factory.mktemp("r") / "a.rec", items, {"note": "x"})
    with RecordFile(path) as rf:
        assert len(rf) == len(items)
        assert rf.metadata == {"note": "x"}
        assert all(same(a, b) for a, b in zip(items, rf))
        for i in reversed(range(len(items))):  # random access, any order
            assert same(rf[i], items[i])
            assert same(rf[i - len(items)], items[i])


def test_arrays_come_back_writable_with_dtype_and_shape(tmp_path):
    image = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    path = write(tmp_path / "a.rec", [{"image": image, "label": 7, "name": "cat", "raw": b"\0"}])
    back = RecordFile(path)[0]
    assert back["image"].dtype == np.uint8 and back["image"].shape == (2, 4, 3)
    back["image"][0, 0, 0] = 99  # a fresh copy, not a view of a read-only buffer
    assert back["label"] == 7 and back["name"] == "cat" and back["raw"] == b"\0"


def test_out_of_range_and_bad_index(tmp_path):
    rf = RecordFile(write(tmp_path / "a.rec", [b"x", b"y"]))
    with pytest.raises(IndexError, match="record 2 out of range"):
        rf[2]
    with pytest.raises(IndexError):
        rf[-3]
    with pytest.raises(ArgumentError, match="int"):
        rf["0"]


def test_no_pickle_for_objects(tmp_path):
    with RecordWriter(tmp_path / "a.rec") as writer:
        with pytest.raises(ArgumentError, match="without pickle"):
            writer.write({"x": np.array([object()])})
        with pytest.raises(ArgumentError, match="bytes or a dict"):
            writer.write([1, 2])
        with pytest.raises(ArgumentError, match="set"):
            writer.write({"x": {1}})


def test_empty_file_is_valid(tmp_path):
    rf = RecordFile(write(tmp_path / "a.rec", []))
    assert len(rf) == 0 and list(rf) == []


def test_not_a_record_file(tmp_path):
    (tmp_path / "x.rec").write_bytes(b"hello world, this is not a record file at all")
    with pytest.raises(RecordError, match="bad magic"):
        RecordFile(tmp_path / "x.rec")
    with pytest.raises(RecordError, match="cannot open"):
        RecordFile(tmp_path / "missing.rec")
    assert issubclass(RecordError, MLSysError) and issubclass(RecordError, ValueError)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 25), files=st.integers(1, 4), shards=st.integers(1, 5))
def test_shards_are_disjoint_and_complete(tmp_path_factory, n, files, shards):
    items = [{"id": i} for i in range(n)]
    paths = write_sharded(items, tmp_path_factory.mktemp("s") / "data", files)
    assert [os.path.basename(p) for p in paths] == \
        [f"data-{k:05d}-of-{files:05d}.rec" for k in range(files)]
    seen = [[r["id"] for r in read_shard(paths, shards, k)] for k in range(shards)]
    flat = [i for shard in seen for i in shard]
    assert sorted(flat) == list(range(n)) and len(set(flat)) == n
    assert max(map(len, seen)) - min(map(len, seen)) <= 1
    piped = [[r["id"] for r in Pipeline.from_records(paths, shards, k)] for k in range(shards)]
    assert piped == seen


def test_shard_arguments_checked(tmp_path):
    paths = write_sharded([b"a"], tmp_path / "d", 1)
    with pytest.raises(ArgumentError, match="shard_id"):
        list(read_shard(paths, 2, 2))
    with pytest.raises(ArgumentError, match="num_shards"):
        list(read_shard(paths, 0, 0))
    with pytest.raises(ArgumentError, match="shard_id"):
        Pipeline.from_records(paths, 2, -1)


def small_file(tmp_path):
    items = [b"abc", {"x": np.array([1, 2], np.int16), "y": 3}, b""]
    path = write(tmp_path / "small.rec", items, {"k": 1})
    return path, items


def record_extents(items, meta):
    """Byte ranges of each record, from the documented layout (independent of the reader)."""
    header = 8 + 4 + 4 + len(meta) + 4
    extents, offset = [], header
    for item in items:
        size = 8 + len(encode_payload(item)) + 4
        extents.append((offset, offset + size))
        offset += size
    return extents


def read_all(path):
    with RecordFile(path) as rf:
        return list(rf)


def test_every_flipped_byte_is_detected(tmp_path):
    path, items = small_file(tmp_path)
    data = path.read_bytes()
    meta = b'{"format":"mlsys_lab.records","user":{"k":1}}'
    assert data[16:16 + len(meta)] == meta
    extents = record_extents(items, meta)
    bad = tmp_path / "bad.rec"
    for position in range(len(data)):
        for flip in (0x01, 0x80):
            corrupted = bytearray(data)
            corrupted[position] ^= flip
            bad.write_bytes(bytes(corrupted))
            with pytest.raises(RecordError) as info:
                read_all(bad)
            message = str(info.value)
            assert str(bad) in message
            inside = [i for i, (a, b) in enumerate(extents) if a <= position < b]
            if inside:
                assert f"record {inside[0]}" in message, (position, message)


def test_every_truncation_is_detected(tmp_path):
    path, _ = small_file(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "short.rec"
    for length in range(len(data)):
        bad.write_bytes(data[:length])
        with pytest.raises(RecordError, match="short.rec"):
            read_all(bad)
    bad.write_bytes(data + b"\0")  # trailing garbage is corruption too
    with pytest.raises(RecordError):
        read_all(bad)


def test_a_corrupted_record_fails_when_read_not_silently_skipped(tmp_path):
    path = write(tmp_path / "a.rec", [b"one", b"two", b"three"])
    data = bytearray(path.read_bytes())
    data[data.index(b"two")] ^= 0xFF
    path.write_bytes(bytes(data))
    rf = RecordFile(path)  # the structure is intact: opening works
    assert rf[0] == b"one" and rf[2] == b"three"
    with pytest.raises(RecordError, match="record 1: CRC mismatch"):
        rf[1]
    with pytest.raises(RecordError, match="record 1"):
        list(Pipeline.from_records(path))


def test_layout_matches_the_documentation(tmp_path):
    path = write(tmp_path / "a.rec", [b"hi"])
    data = path.read_bytes()
    assert data[:8] == rec.MAGIC and data[-8:] == rec.END_MAGIC
    (index_offset,) = struct.unpack_from("<Q", data, len(data) - 20)
    (count,) = struct.unpack_from("<Q", data, index_offset)
    assert count == 1
    (first,) = struct.unpack_from("<Q", data, index_offset + 8)
    (length,) = struct.unpack_from("<Q", data, first)
    assert decode_payload(data[first + 8:first + 8 + length]) == b"hi"


def test_record_and_pipeline_errors_are_the_library_errors():
    import mlsys_lab.data as data
    from mlsys_lab import errors
    from mlsys_lab.data import pipeline, records

    assert data.RecordError is records.RecordError is errors.RecordError
    assert data.PipelineError is pipeline.PipelineError is errors.PipelineError
    assert issubclass(errors.RecordError, (errors.MLSysError, ValueError))
    assert issubclass(errors.PipelineError, (errors.MLSysError, RuntimeError))
    failure = errors.PipelineError("map 'f' failed", op="f", index=3)
    assert (failure.op, failure.index) == ("f", 3)


def test_a_directory_or_other_non_file_is_refused_by_name(tmp_path):
    """Issue 26.6: RecordFile(<a directory>) raised a bare IsADirectoryError from pread."""
    folder = tmp_path / "shards"
    folder.mkdir()
    with pytest.raises(RecordError, match=r"'.*shards'.*is a directory; expected a record file"):
        RecordFile(folder)
    with pytest.raises(RecordError, match="is a directory"):
        list(read_shard(folder))
    with pytest.raises(RecordError, match="not a regular file"):
        RecordFile(os.devnull)
    os.mkfifo(tmp_path / "pipe")  # opening a FIFO would wait for a writer forever
    with pytest.raises(RecordError, match="pipe.*not a regular file"):
        RecordFile(tmp_path / "pipe")
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(RecordError, match=r"'.*plain' is a file, not a directory"):
        RecordFile(tmp_path / "plain" / "a.rec")
    with pytest.raises(RecordError, match="no such file"):
        RecordFile(tmp_path / "missing.rec")
    with pytest.raises(RecordError, match="truncated.*the file has 0"):
        RecordFile(tmp_path / "plain")
    for bad in (None, 3):
        with pytest.raises(ArgumentError, match="RecordFile: path must be a str"):
            RecordFile(bad)
    with pytest.raises(ArgumentError, match="path is empty"):
        RecordFile("")


def test_a_writer_path_that_cannot_be_created_is_a_record_error(tmp_path):
    """Issue 26.6: RecordWriter raised bare IsADirectoryError / FileNotFoundError /
    NotADirectoryError, and a full disk a bare OSError."""
    with pytest.raises(RecordError, match=r"RecordWriter\('.*'\): cannot create.*is a directory"):
        RecordWriter(tmp_path)
    with pytest.raises(RecordError, match=r"the directory '.*nowhere' does not exist"):
        RecordWriter(tmp_path / "nowhere" / "a.rec")
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(RecordError, match=r"'.*plain' is a file, not a directory"):
        RecordWriter(tmp_path / "plain" / "a.rec")
    with pytest.raises(RecordError, match="plain.*is a file, not a directory"):
        write_sharded([b"a", b"b"], tmp_path / "plain" / "train", 2)
    with pytest.raises(ArgumentError, match="RecordWriter: path must be a str"):
        RecordWriter(None)
    if os.path.exists("/dev/full"):
        with pytest.raises(RecordError, match="cannot write.*No space left"):
            with RecordWriter("/dev/full") as writer:
                writer.write(b"x" * 100_000)


@pytest.mark.parametrize("payload, message", [
    (b"", "empty payload"),
    (b"\x07", "unknown payload tag 7"),
    (b"\x01\x02", "needs 4 bytes"),
    (b"\x01\x10\0\0\0{}", "runs past the payload"),
    (b"\x01\x02\0\0\0[1", "JSONDecodeError"),
    (b'\x01\x0c\0\0\0[{"kind":1}]', "unknown kind 1"),
    (b'\x01\x33\0\0\0[{"name":"a","kind":"bytes","offset":0,"nbytes":9}]xy', "runs past"),
    (b'\x01\x4d\0\0\0[{"name":"a","kind":"array","dtype":"<f4","shape":[3],"offset":0,'
     b'"nbytes":4}]abcd', "ValueError"),
])
def test_a_malformed_payload_is_a_record_error(payload, message):
    """decode_payload raised bare ValueError, struct.error (not even a ValueError, so
    RecordFile.__getitem__ let it through) and KeyError on payloads it cannot read."""
    with pytest.raises(RecordError, match=message):
        decode_payload(payload)
