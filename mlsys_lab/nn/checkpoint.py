"""Checkpoints: ``ml.save`` / ``ml.load`` to ``.npz`` files, never pickle.

A checkpoint is a (possibly nested) dict of arrays, Tensors, numbers and strings. Nested keys are
joined with ``/``; a JSON header records the format version and the Python type of each entry, so
numbers and strings come back as they went in. Writing goes to a temporary file that replaces the
target only when complete, so a crash mid-save never destroys the previous checkpoint.
"""

import json
import os
import tempfile

import numpy as np

from ..engine.tensor import Tensor
from ..errors import CheckpointError

FORMAT = "mlsys_lab.checkpoint/1"
_HEADER = "__mlsys_lab__"


def _flatten(obj, prefix, arrays, kinds):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str) or "/" in k or k in ("", _HEADER):
                raise CheckpointError(f"save: key {k!r} must be a non-empty string without '/'")
            _flatten(v, f"{prefix}/{k}" if prefix else k, arrays, kinds)
        if not obj:
            kinds[prefix] = "emptydict"
        return
    if isinstance(obj, Tensor):
        arrays[prefix], kinds[prefix] = obj.numpy(), "array"
    elif isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise CheckpointError(f"save: {prefix} is an object array, which would need pickle")
        arrays[prefix], kinds[prefix] = obj, "array"
    elif isinstance(obj, (bool, np.bool_)):
        arrays[prefix], kinds[prefix] = np.asarray(obj), "bool"
    elif isinstance(obj, (int, np.integer)) and not -2**63 <= int(obj) < 2**63:
        # An int past int64 (a PCG64 generator's state) is kept exactly, as its decimal digits.
        arrays[prefix], kinds[prefix] = np.asarray(str(int(obj))), "bigint"
    elif isinstance(obj, (int, np.integer)):
        arrays[prefix], kinds[prefix] = np.asarray(obj, np.int64), "int"
    elif isinstance(obj, (float, np.floating)):
        arrays[prefix], kinds[prefix] = np.asarray(obj, np.float64), "float"
    elif isinstance(obj, str):
        arrays[prefix], kinds[prefix] = np.asarray(obj), "str"
    elif obj is None:
        kinds[prefix] = "none"
    else:
        raise CheckpointError(f"save: cannot store {prefix} of type {type(obj).__name__} "
                              f"(arrays, Tensors, numbers, strings and dicts only)")


def save(obj, path):
    """Save a dict (e.g. ``model.state_dict()``) to ``path`` (.npz) atomically.

    Raises:
        CheckpointError: ``obj`` holds something a checkpoint cannot store without pickle, or
            the file cannot be written (a missing folder, no permission, a full disk); the
            previous file at ``path``, if any, is then left as it was.
    """
    if not isinstance(obj, dict):
        raise CheckpointError(f"save: expects a dict such as model.state_dict(), got "
                              f"{type(obj).__name__}")
    arrays, kinds = {}, {}
    _flatten(obj, "", arrays, kinds)
    header = json.dumps({"format": FORMAT, "kinds": kinds})
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CheckpointError(f"save: cannot write {path}: the folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz", dir=folder)
    except OSError as e:
        raise CheckpointError(f"save: cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{_HEADER: np.asarray(header)}, **arrays)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise CheckpointError(f"save: cannot write {path}: {e.strerror or e}") from None
        raise


def load(path):
    """Load a checkpoint written by :func:`save`.

    Raises:
        CheckpointError: naming the file and the problem, if it is missing, truncated,
            corrupted, not an mlsys_lab checkpoint, or its header does not describe its
            contents (bad JSON, unknown kinds, keys that clash, a scalar kind on an array).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"load: no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _HEADER not in z.files:
                raise CheckpointError(f"load: {path} is not an mlsys_lab checkpoint (no header)")
            kinds = _read_header(path, z[_HEADER])
            flat = {k: z[k] for k in z.files if k != _HEADER}
    except CheckpointError:
        raise
    except Exception as e:  # BadZipFile, OSError, zlib.error, ... from a damaged archive
        raise CheckpointError(f"load: {path} is truncated or corrupted ({type(e).__name__}: "
                              f"{e})") from None
    _check_keys(path, kinds, flat)
    out = {}
    for key, kind in kinds.items():
        value = _convert(path, key, kind, flat[key]) if key in flat else _EMPTY[kind]()
        _insert(out, key.split("/") if key else [], value)
    return out


_SCALARS = {"int": ("iu", int), "bigint": ("U", int), "float": ("fiu", float), "bool": ("b", bool),
            "str": ("U", str)}
_EMPTY = {"none": lambda: None, "emptydict": dict}
KINDS = ("array", *_SCALARS, *_EMPTY)


def _read_header(path, stored):
    """The ``kinds`` table of the header, checked: {key: one of KINDS}."""
    bad = f"load: {path} has a malformed header"
    if stored.shape != () or stored.dtype.kind != "U":
        raise CheckpointError(f"{bad}: expected a JSON string, got a {stored.dtype} array of "
                              f"shape {stored.shape}")
    try:
        header = json.loads(str(stored))
    except ValueError as e:
        raise CheckpointError(f"{bad}: not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{bad}: expected a JSON object, got {type(header).__name__}")
    if header.get("format") != FORMAT:
        raise CheckpointError(f"load: {path} has format {header.get('format')!r}, expected "
                              f"{FORMAT!r}")
    kinds = header.get("kinds")
    if not isinstance(kinds, dict):
        raise CheckpointError(f"{bad}: 'kinds' must be an object mapping each key to its kind, "
                              f"got {type(kinds).__name__}")
    for key, kind in kinds.items():
        if not isinstance(kind, str) or kind not in KINDS:
            raise CheckpointError(f"{bad}: key {key!r} has unknown kind {kind!r} (known: "
                                  f"{', '.join(KINDS)})")
    return kinds


def _check_keys(path, kinds, flat):
    """The header's keys match the stored arrays and nest without clashes."""
    stored = {k for k, kind in kinds.items() if kind not in _EMPTY}
    missing, extra = sorted(stored - set(flat)), sorted(set(flat) - stored)
    if missing or extra:
        raise CheckpointError(f"load: {path} is incomplete: header and contents disagree "
                              f"(listed but not stored: {missing}; stored but not listed as "
                              f"arrays or values: {extra})")
    for key in kinds:
        parts = key.split("/")
        if "" in parts and not (key == "" and len(kinds) == 1 and kinds[key] == "emptydict"):
            raise CheckpointError(f"load: {path} has a key with an empty part: {key!r}")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in kinds:
                raise CheckpointError(f"load: {path} has clashing keys {prefix!r} and {key!r}: "
                                      f"{prefix!r} cannot be both a value and a dict")


def _convert(path, key, kind, array):
    if kind == "array":
        return array
    dtype_kinds, make = _SCALARS[kind]
    if array.shape != () or array.dtype.kind not in dtype_kinds:
        raise CheckpointError(f"load: {path}: {key!r} has kind {kind!r} but holds a "
                              f"{array.dtype} array of shape {array.shape}")
    return make(array.item())


def _insert(d, parts, value):
    if not parts:
        return
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value
