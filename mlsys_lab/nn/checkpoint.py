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
            if not isinstance(k, str) or "/" in k or k == _HEADER:
                raise CheckpointError(f"save: key {k!r} must be a string without '/'")
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
    """Save a dict (e.g. ``model.state_dict()``) to ``path`` (.npz) atomically."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"save: expects a dict such as model.state_dict(), got "
                              f"{type(obj).__name__}")
    arrays, kinds = {}, {}
    _flatten(obj, "", arrays, kinds)
    header = json.dumps({"format": FORMAT, "kinds": kinds})
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{_HEADER: np.asarray(header)}, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path):
    """Load a checkpoint written by :func:`save`; raises CheckpointError if the file is
    missing, truncated, corrupted or not an mlsys_lab checkpoint."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"load: no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            if _HEADER not in z.files:
                raise CheckpointError(f"load: {path} is not an mlsys_lab checkpoint (no header)")
            header = json.loads(str(z[_HEADER]))
            if header.get("format") != FORMAT:
                raise CheckpointError(f"load: {path} has format {header.get('format')!r}, "
                                      f"expected {FORMAT!r}")
            flat = {k: z[k] for k in z.files if k != _HEADER}
    except CheckpointError:
        raise
    except Exception as e:  # BadZipFile, OSError, zlib.error, ... from a damaged archive
        raise CheckpointError(f"load: {path} is truncated or corrupted ({type(e).__name__}: "
                              f"{e})") from None
    kinds = header["kinds"]
    if set(k for k, v in kinds.items() if v not in ("none", "emptydict")) != set(flat):
        raise CheckpointError(f"load: {path} is incomplete: header and contents disagree")
    out = {}
    for key, kind in kinds.items():
        value = {"none": None, "emptydict": {}}.get(kind)
        if key in flat:
            value = _CONVERT[kind](flat[key])
        _insert(out, key.split("/") if key else [], value)
    return out


_CONVERT = {"array": lambda a: a, "int": int, "float": float, "bool": bool, "str": str}


def _insert(d, parts, value):
    if not parts:
        return
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value
