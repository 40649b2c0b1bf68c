"""An indexed record file: random access and sequential streaming, a CRC32 on every part.

Layout (all integers little-endian)::

    header   magic b"MLSYSREC" | u32 version | u32 n | n bytes of JSON metadata | u32 CRC(header)
    record   u64 length | payload (length bytes) | u32 CRC(length field + payload)   ... repeated
    index    u64 count | count x u64 record offsets | u32 CRC(index)
    footer   u64 index offset | u32 CRC(index offset) | magic b"MLRECEND"

The record count lives in the index (it is not known while the records stream out); the
metadata JSON holds the format name and the writer's metadata. Opening a file checks the footer,
the header, the index and that every record's extent ends where the next one begins; reading a
record checks its CRC, which also covers its length field. A mismatch anywhere raises
``RecordError`` naming the file and, for a record, its index: nothing is skipped silently.

A payload is either raw ``bytes`` (tag 0) or a dict (tag 1) of numpy arrays, bytes, strings and
numbers, serialised without pickle as a small JSON table of contents followed by raw buffers.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ArgumentError, RecordError

__all__ = ["RecordError", "RecordWriter", "RecordFile", "write_sharded", "read_shard",
           "shard_paths", "encode_payload", "decode_payload"]

MAGIC = b"MLSYSREC"
END_MAGIC = b"MLRECEND"
VERSION = 1
FORMAT_NAME = "mlsys_lab.records"
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_FOOTER = struct.Struct("<QI8s")
_TAG_BYTES, _TAG_DICT = 0, 1
_SCALARS = (bool, int, float, str, type(None))


def _crc(*chunks: bytes) -> int:
    value = 0
    for chunk in chunks:
        value = zlib.crc32(chunk, value)
    return value


# ---------------------------------------------------------------------------------------------
# Payloads: bytes, or a dict of arrays / bytes / scalars, without pickle.

def encode_payload(value) -> bytes:
    """Serialise ``bytes`` or a dict of numpy arrays, bytes, str and numbers (no pickle).

    Raises:
        ArgumentError: Any other type, an object-dtype array or a non-string key.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes([_TAG_BYTES]) + bytes(value)
    if not isinstance(value, Mapping):
        raise ArgumentError(f"records: a record is bytes or a dict, not {type(value).__name__}")
    fields, buffers, offset = [], [], 0
    for key, item in value.items():
        if not isinstance(key, str):
            raise ArgumentError(f"records: dict keys must be str, got {key!r}")
        if isinstance(item, (bytes, bytearray, memoryview)):
            raw, entry = bytes(item), {"name": key, "kind": "bytes"}
        elif isinstance(item, (np.ndarray, np.generic)):
            array = np.asarray(item)
            if array.dtype.hasobject or array.dtype.kind in "OV":
                raise ArgumentError(f"records: field {key!r} has dtype {array.dtype}, which "
                                    "cannot be stored without pickle")
            raw = np.ascontiguousarray(array).tobytes()
            entry = {"name": key, "kind": "array", "dtype": array.dtype.str,
                     "shape": list(array.shape)}
        elif isinstance(item, _SCALARS):
            fields.append({"name": key, "kind": "scalar", "value": item})
            continue
        else:
            raise ArgumentError(f"records: field {key!r} is a {type(item).__name__}; use a "
                                "numpy array, bytes, str, int, float, bool or None")
        entry.update(offset=offset, nbytes=len(raw))
        fields.append(entry)
        buffers.append(raw)
        offset += len(raw)
    toc = json.dumps(fields, separators=(",", ":")).encode()
    return b"".join([bytes([_TAG_DICT]), _U32.pack(len(toc)), toc, *buffers])


def decode_payload(payload: bytes):
    """Inverse of ``encode_payload``: ``bytes`` or a dict (arrays are fresh, writable copies).

    Raises:
        RecordError: ``payload`` is not one ``encode_payload`` writes (empty, an unknown tag,
            a table of contents that is cut short, not JSON or names a field outside the
            payload, a dtype without pickle-free storage or a shape that does not fit).
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise ArgumentError(f"decode_payload: expects bytes, got {type(payload).__name__}")
    if not len(payload):
        raise RecordError("decode_payload: empty payload (no type tag)")
    payload = memoryview(payload).cast("B")
    tag, body = payload[0], payload[1:]
    if tag == _TAG_BYTES:
        return bytes(body)
    if tag != _TAG_DICT:
        raise RecordError(f"decode_payload: unknown payload tag {tag} (0 is bytes, 1 a dict)")
    try:
        return _decode_dict(body)
    except RecordError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error) as exc:
        raise RecordError(f"decode_payload: malformed dict payload ({type(exc).__name__}: "
                          f"{exc})") from None


def _decode_dict(body):
    if len(body) < 4:
        raise RecordError(f"decode_payload: the table of contents' length needs 4 bytes, the "
                          f"payload has {len(body)}")
    (toc_len,) = _U32.unpack_from(body, 0)
    if 4 + toc_len > len(body):
        raise RecordError(f"decode_payload: the table of contents ({toc_len} bytes) runs past "
                          f"the payload ({len(body) - 4} bytes)")
    fields = json.loads(bytes(body[4:4 + toc_len]))
    data = body[4 + toc_len:]
    out = {}
    for field in fields:
        if field["kind"] == "scalar":
            out[field["name"]] = field["value"]
            continue
        if field["kind"] not in ("bytes", "array"):
            raise RecordError(f"decode_payload: field {field.get('name')!r} has unknown kind "
                              f"{field['kind']!r}")
        start, stop = int(field["offset"]), int(field["offset"]) + int(field["nbytes"])
        if start < 0 or stop < start or stop > len(data):
            raise RecordError(f"decode_payload: field {field['name']!r} (bytes {start}..{stop})"
                              f" runs past the payload ({len(data)} bytes of data)")
        raw = data[start:stop]
        if field["kind"] == "bytes":
            out[field["name"]] = bytes(raw)
        else:
            dtype = np.dtype(field["dtype"])
            if dtype.hasobject:
                raise RecordError(f"decode_payload: field {field['name']!r} has dtype {dtype}, "
                                  "which a record never holds (it needs pickle)")
            out[field["name"]] = np.frombuffer(raw, dtype=dtype).reshape(field["shape"]).copy()
    return out


# ---------------------------------------------------------------------------------------------
# Paths: a record file is one regular file.

def _path_arg(fn: str, path) -> str:
    """``path`` as a str, refusing what is no path at all (None, a number)."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise ArgumentError(f"{fn}: path must be a str or os.PathLike naming a record file, "
                            f"got {type(path).__name__}") from None
    if not path:
        raise ArgumentError(f"{fn}: path is empty; expected the path of a record file")
    return path


def _open_error(fn: str, path, exc: OSError, verb: str) -> RecordError:
    """The error for ``exc``, raised by the OS when ``fn`` tried to ``verb`` the file ``path``:
    it names the file, what was expected and, for a missing folder or a file where a folder
    should be, which part of the path is at fault."""
    shown = os.fsdecode(path)
    folder = os.path.dirname(shown) or "."
    if exc.errno == errno.EISDIR or os.path.isdir(shown):
        why = ("it is a directory; expected the path of a record file to create "
               "(write_sharded takes a file-name prefix such as 'folder/train')"
               if verb == "create" else
               "it is a directory; expected a record file (the shards of a set are several "
               "files: pass shard_paths(prefix, num_shards) to read_shard)")
    elif exc.errno == errno.EINVAL and verb == "open":
        why = "it is not a regular file (a device, a FIFO or a socket); expected a record file"
    elif exc.errno == errno.ENOTDIR:
        parent = folder
        while parent and not os.path.exists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        why = (f"{parent!r} is a file, not a directory" if os.path.isfile(parent)
               else "a part of the path that should be a directory is a file")
    elif exc.errno == errno.ENOENT and verb == "create":
        why = f"the directory {folder!r} does not exist"
    elif exc.errno == errno.ENOENT:
        why = "no such file"
    else:
        why = exc.strerror or str(exc)
    return RecordError(f"{fn}({shown!r}): cannot {verb} the record file: {why}")


# ---------------------------------------------------------------------------------------------
# Writing.

class RecordWriter:
    """Write records to ``path`` (a context manager; the index is written on ``close``).

    Example::

        with RecordWriter("train.rec", metadata={"classes": 10}) as w:
            w.write({"image": png_bytes, "label": 3})

    Args:
        path: The file to create (overwritten if it exists).
        metadata: JSON-serialisable dict stored in the header.

    Raises:
        RecordError: The file cannot be created or written (``path`` is a directory, its
            directory is missing or is a file, no permission, a full disk); the message names
            the path and what is wrong.
        ArgumentError: ``path`` is not a path, or ``metadata`` is not JSON-serialisable.
    """

    def __init__(self, path, metadata: Mapping | None = None):
        self._file = None
        self.path = _path_arg("RecordWriter", path)
        meta = {"format": FORMAT_NAME, "user": dict(metadata or {})}
        try:
            meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        except TypeError as exc:
            raise ArgumentError(f"RecordWriter({self.path!r}): metadata is not JSON: {exc}") \
                from None
        head = MAGIC + _U32.pack(VERSION) + _U32.pack(len(meta_bytes)) + meta_bytes
        try:
            self._file = open(self.path, "wb")  # closed in close()
        except OSError as exc:
            raise _open_error("RecordWriter", self.path, exc, "create") from None
        self._offset = 0
        self._offsets: list[int] = []
        self._write(head + _U32.pack(_crc(head)))

    def _write(self, *chunks: bytes) -> None:
        """Write ``chunks``; an OS failure (a full disk) closes the file and is a RecordError."""
        try:
            for chunk in chunks:
                self._file.write(chunk)
                self._offset += len(chunk)
        except OSError as exc:
            self._abandon()
            raise RecordError(f"RecordWriter({self.path!r}): cannot write the record file: "
                              f"{exc.strerror or exc}") from None

    def _abandon(self) -> None:
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:
            pass  # the write that failed already says what went wrong

    def write(self, record) -> int:
        """Append one record (``bytes`` or a dict, see ``encode_payload``); return its index."""
        if self._file is None:
            raise ArgumentError(f"RecordWriter({self.path!r}) is closed")
        payload = encode_payload(record)
        length = _U64.pack(len(payload))
        start = self._offset
        self._write(length, payload, _U32.pack(_crc(length, payload)))
        self._offsets.append(start)
        return len(self._offsets) - 1

    def close(self) -> None:
        """Write the index and footer and close the file (idempotent).

        Raises:
            RecordError: the OS could not write or flush the file (a full disk).
        """
        if self._file is None:
            return
        index = _U64.pack(len(self._offsets)) + b"".join(_U64.pack(o) for o in self._offsets)
        index_offset = self._offset
        self._write(index + _U32.pack(_crc(index)),
                    _FOOTER.pack(index_offset, _crc(_U64.pack(index_offset)), END_MAGIC))
        file, self._file = self._file, None
        try:
            file.close()  # flushes: a full disk may show only here
        except OSError as exc:
            raise RecordError(f"RecordWriter({self.path!r}): cannot write the record file: "
                              f"{exc.strerror or exc}") from None

    def __len__(self) -> int:
        return len(self._offsets)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        if exc_info[0] is not None and self._file is not None:
            try:
                self.close()
            except RecordError:
                pass  # the exception already in flight says more
            return
        self.close()


def shard_paths(prefix, num_shards: int) -> list[str]:
    """The file names ``write_sharded`` uses: ``{prefix}-00000-of-00004.rec`` ..."""
    check_shards("shard_paths", num_shards, 0)
    return [f"{os.fspath(prefix)}-{k:05d}-of-{num_shards:05d}.rec" for k in range(num_shards)]


def write_sharded(records: Iterable, prefix, num_shards: int,
                  metadata: Mapping | None = None) -> list[str]:
    """Write ``records`` round-robin into ``num_shards`` files; return their paths.

    Record ``j`` goes to shard ``j % num_shards``; every shard's header records its shard id.
    """
    paths = shard_paths(prefix, num_shards)
    writers = []
    try:
        for k, p in enumerate(paths):
            writers.append(RecordWriter(p, {**dict(metadata or {}), "shard": k,
                                            "num_shards": num_shards}))
        for j, record in enumerate(records):
            writers[j % num_shards].write(record)
    finally:
        for writer in writers:
            writer.close()
    return paths


# ---------------------------------------------------------------------------------------------
# Reading.

class RecordFile:
    """Read a record file: ``len(rf)``, ``rf[i]`` (random access), ``for r in rf`` (in order).

    The structure is validated on open; each record's CRC is checked when it is read. Reads use
    ``os.pread`` so one open file can serve several threads (and forked processes).

    Raises:
        RecordError: The file is missing, a directory or no regular file, truncated, corrupted
            or not a record file (the message names the path and what is wrong).
        ArgumentError: ``path`` is not a path (None, a number).
    """

    def __init__(self, path):
        self._fd = None
        self.path = _path_arg("RecordFile", path)
        try:  # before opening: opening a FIFO would wait for a writer
            kind = os.stat(self.path).st_mode
            if not stat.S_ISREG(kind):
                raise IsADirectoryError(errno.EISDIR, "Is a directory") if stat.S_ISDIR(kind) \
                    else OSError(errno.EINVAL, "Not a regular file")
            self._fd = os.open(self.path, os.O_RDONLY)
            info = os.fstat(self._fd)
        except OSError as exc:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            raise _open_error("RecordFile", self.path, exc, "open") from None
        try:
            self._size = info.st_size
            self.metadata, data_start = self._read_header()
            self._offsets = self._read_index(data_start)
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def _fail(self, what: str) -> RecordError:
        return RecordError(f"record file {self.path!r}: {what}")

    def _pread(self, n: int, offset: int, what: str) -> bytes:
        data = os.pread(self._fd, n, offset) if n else b""
        if len(data) != n:
            raise self._fail(f"truncated: {what} needs {n} bytes at offset {offset}, the file "
                             f"has {self._size}")
        return data

    def _read_header(self):
        fixed = len(MAGIC) + 8
        head = self._pread(fixed, 0, "the header")
        if head[:len(MAGIC)] != MAGIC:
            raise self._fail("not a record file (bad magic)")
        (meta_len,) = _U32.unpack_from(head, len(MAGIC) + 4)
        if fixed + meta_len + 4 > self._size:
            raise self._fail(f"truncated or corrupted header (metadata length {meta_len})")
        rest = self._pread(meta_len + 4, fixed, "the header")
        (crc,) = _U32.unpack_from(rest, meta_len)
        if crc != _crc(head, rest[:meta_len]):
            raise self._fail("header CRC mismatch (corrupted header)")
        (version,) = _U32.unpack_from(head, len(MAGIC))
        if version != VERSION:
            raise self._fail(f"version {version}; this reader reads version {VERSION}")
        try:
            meta = json.loads(rest[:meta_len])
        except ValueError as exc:  # the CRC matched, so the writer wrote it so
            raise self._fail(f"the header's metadata is not JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise self._fail(f"the header's metadata is a JSON {type(meta).__name__}, not an "
                             "object")
        return meta.get("user", {}), fixed + meta_len + 4

    def _read_index(self, data_start: int) -> list[int]:
        if self._size < data_start + _FOOTER.size:
            raise self._fail("truncated: no footer (file ends before the index)")
        footer = self._pread(_FOOTER.size, self._size - _FOOTER.size, "the footer")
        index_offset, crc, magic = _FOOTER.unpack(footer)
        if magic != END_MAGIC:
            raise self._fail("truncated or corrupted: the footer's end marker is missing")
        if crc != _crc(footer[:8]):
            raise self._fail("footer CRC mismatch (corrupted footer)")
        index_len = self._size - _FOOTER.size - index_offset
        if index_offset < data_start or index_len < 12 or (index_len - 12) % 8:
            raise self._fail(f"corrupted footer: index offset {index_offset} is inconsistent "
                             f"with the file size {self._size}")
        index = self._pread(index_len, index_offset, "the index")
        (count,) = _U64.unpack_from(index, 0)
        (crc,) = _U32.unpack_from(index, index_len - 4)
        if crc != _crc(index[:-4]):
            raise self._fail("index CRC mismatch (corrupted index)")
        if count * 8 + 12 != index_len:
            raise self._fail(f"index holds {count} records but is {index_len} bytes long")
        offsets = [_U64.unpack_from(index, 8 + 8 * i)[0] for i in range(count)]
        bounds = [data_start, *offsets[1:], index_offset] if offsets else [data_start]
        if offsets and offsets[0] != data_start:
            raise self._fail("index: the first record does not start after the header")
        if not offsets and index_offset != data_start:
            raise self._fail("index: no records, but bytes between the header and the index")
        for i in range(count):
            if bounds[i + 1] < bounds[i] + 12:
                raise self._fail(f"index: record {i} at offset {bounds[i]} is shorter than a "
                                 "record's length and CRC fields")
        self._index_offset = index_offset
        return offsets

    def _extent(self, i: int) -> tuple[int, int]:
        start = self._offsets[i]
        stop = self._offsets[i + 1] if i + 1 < len(self._offsets) else self._index_offset
        return start, stop

    def read_payload(self, i: int) -> bytes:
        """The checked payload bytes of record ``i`` (before decoding)."""
        if self._fd is None:
            raise ArgumentError(f"RecordFile({self.path!r}) is closed")
        i = self._check_index(i)
        start, stop = self._extent(i)
        blob = self._pread(stop - start, start, f"record {i}")
        (length,) = _U64.unpack_from(blob, 0)
        if length + 12 != len(blob):
            raise self._fail(f"record {i}: length field says {length} bytes but the index "
                             f"leaves {len(blob) - 12} (corrupted record)")
        (crc,) = _U32.unpack_from(blob, len(blob) - 4)
        if crc != _crc(blob[:-4]):
            raise self._fail(f"record {i}: CRC mismatch (corrupted record)")
        return blob[8:-4]

    def __getitem__(self, i: int):
        payload = self.read_payload(i)
        try:
            return decode_payload(payload)
        except (ValueError, KeyError, TypeError) as exc:
            raise self._fail(f"record {i}: malformed payload ({exc})") from None

    def _check_index(self, i) -> int:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise ArgumentError(f"RecordFile index must be an int, got {type(i).__name__}")
        n = len(self._offsets)
        if not -n <= i < n:
            raise IndexError(f"record file {self.path!r}: record {i} out of range (0..{n - 1})")
        return int(i) % n

    def __len__(self) -> int:
        return len(self._offsets)

    def __iter__(self) -> Iterator:
        for i in range(len(self._offsets)):
            yield self[i]

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            self.close()

    def __repr__(self):
        return f"RecordFile({self.path!r}, records={len(self._offsets)})"


def check_shards(fn: str, num_shards, shard_id) -> None:
    """Raise ``ArgumentError`` (naming ``fn``) unless ``0 <= shard_id < num_shards``."""
    if not isinstance(num_shards, (int, np.integer)) or num_shards < 1:
        raise ArgumentError(f"{fn}: num_shards must be a positive int, got {num_shards!r}")
    if not isinstance(shard_id, (int, np.integer)) or not 0 <= shard_id < num_shards:
        raise ArgumentError(f"{fn}: shard_id must be in 0..{num_shards - 1}, got {shard_id!r}")


def as_paths(paths) -> list[str]:
    """One path or a sequence of paths as a non-empty list of ``str``."""
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ArgumentError("read_shard: no record files given")
    return paths


def read_shard(paths: str | Sequence, num_shards: int = 1, shard_id: int = 0) -> Iterator:
    """Stream this shard's records from one or more record files.

    The files' records are numbered globally in order (file by file); shard ``shard_id`` gets
    every record whose global number ``g`` has ``g % num_shards == shard_id``, so the shards
    are disjoint, cover every record, and differ in size by at most one.
    """
    check_shards("read_shard", num_shards, shard_id)
    base = 0
    for path in as_paths(paths):
        with RecordFile(path) as rf:
            first = (shard_id - base) % num_shards
            for i in range(first, len(rf), num_shards):
                yield rf[i]
            base += len(rf)
