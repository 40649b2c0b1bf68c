"""The wire between a probe (in the student's kernel) and its judge (in the grader): plain data.

A probe returns what it saw: numbers, strings, lists, tuples, dicts, sets, numpy arrays and
scalars, ``None``. ``encode`` turns that into JSON-ready data — arrays travel as base64 ``.npy``
bytes written with ``allow_pickle=False`` — and ``decode`` turns it back. Nothing on this wire is
ever executed or unpickled, so a judge can read whatever the kernel sent without running student
code.

Objects the wire cannot carry (a student's class, a function, a generator) arrive as ``Opaque``:
their type name and a short repr, taken in the kernel, so a judge can still say "returned a
Liar, expected an int". Subclasses of ``int``, ``float``, ``str``, ``list``, ``tuple`` and
``dict`` arrive as their base type (an ``__eq__`` that always says yes does not survive the trip).
An exception a probe caught with ``attempt`` arrives as ``Raised``.
"""

from __future__ import annotations

import base64
import io
import math
import reprlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_BYTES", "OffLimitsError", "Opaque", "Raised", "WireError", "decode", "encode",
           "raised"]

#: Largest encoded result one exercise may send (characters of JSON).
MAX_BYTES = 32 * 1024 * 1024
_MAX_DEPTH = 64
_TAG = "$"
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 120
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 8


class OffLimitsError(RuntimeError):
    """Raised in the student's code when it calls a function the exercise forbids (by the
    guard; defined here, beside ``Raised``, because ``attempt`` must never turn it into one)."""


class WireError(ValueError):
    """A result could not be encoded (too large, too deep) or decoded (malformed)."""


@dataclass(frozen=True)
class Opaque:
    """Stands in for an object the wire cannot carry: its type and a short repr."""

    type_name: str
    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Raised:
    """An exception the student's code raised, as a probe recorded it with ``attempt``.

    Attributes:
        type_name: the exception's class name (``"ValueError"``).
        bases: the names of every class in its MRO, so ``isinstance``-style tests work.
        message: the first line of its message.
    """

    type_name: str
    bases: tuple[str, ...]
    message: str

    def is_a(self, name: str) -> bool:
        """True when the exception was an instance of a class called ``name``."""
        return name in self.bases

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


def raised(error: BaseException) -> Raised:
    """The ``Raised`` record of an exception (message cut to one line)."""
    try:
        text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    except Exception:  # a student's exception whose __str__ raises
        text = ""
    bases = tuple(cls.__name__ for cls in type(error).__mro__)
    return Raised(type(error).__name__, bases, text)


def _opaque(value: Any) -> dict:
    try:
        text = _short.repr(value)
    except Exception:  # the student's __repr__ raised
        text = f"<{type(value).__name__} object>"
    return {_TAG: "opaque", "type": type(value).__name__, "repr": text}


def _npy(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON-ready data (see the module docstring for what travels how).

    Raises:
        WireError: nesting deeper than 64 levels.
    """
    if _depth > _MAX_DEPTH:
        raise WireError(f"the result is nested more than {_MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() < 10_000 else {_TAG: "int", "hex": hex(value)}
    if kind is float:
        return value if math.isfinite(value) else {_TAG: "float", "repr": repr(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype.hasobject:
            return _opaque(value)
        tag = "ndarray" if isinstance(value, np.ndarray) else "npscalar"
        # ascontiguousarray would turn a 0-d array into shape (1,)
        contiguous = array if array.flags.c_contiguous else array.copy(order="C")
        return {_TAG: tag, "npy": _npy(contiguous)}
    if isinstance(value, Raised):
        return {_TAG: "raised", "type": value.type_name, "bases": list(value.bases),
                "message": value.message}
    if isinstance(value, Opaque):
        return {_TAG: "opaque", "type": value.type_name, "repr": value.text}
    nested = _depth + 1
    if isinstance(value, int):
        return encode(int.__index__(value), nested)
    if isinstance(value, float):
        return encode(float.__float__(value), nested)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return {_TAG: "complex", "re": encode(value.real, nested), "im": encode(value.imag, nested)}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [encode(item, nested) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [encode(item, nested) for item in tuple.__iter__(value)]}
    if isinstance(value, (set, frozenset)):
        members = set.__iter__(value) if isinstance(value, set) else frozenset.__iter__(value)
        return {_TAG: "set", "items": [encode(item, nested) for item in members]}
    if isinstance(value, dict):
        pairs = list(dict.items(value))
        if all(type(k) is str for k, _ in pairs) and _TAG not in dict.keys(value):
            return {k: encode(v, nested) for k, v in pairs}
        return {_TAG: "dict", "items": [[encode(k, nested), encode(v, nested)] for k, v in pairs]}
    return _opaque(value)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a decoded dict key or set item (lists become tuples)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return Opaque("ndarray", repr(value))
    return value


def decode(data: Any, _depth: int = 0) -> Any:
    """The inverse of ``encode``. Never executes or unpickles anything.

    Raises:
        WireError: the data is not something ``encode`` produces.
    """
    if _depth > _MAX_DEPTH + 2:
        raise WireError("malformed result: nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    nested = _depth + 1
    if isinstance(data, list):
        return [decode(item, nested) for item in data]
    if not isinstance(data, dict):
        raise WireError(f"malformed result: unexpected {type(data).__name__}")
    tag = data.get(_TAG)
    if tag is None:
        return {k: decode(v, nested) for k, v in data.items()}
    try:
        if tag == "tuple":
            return tuple(decode(item, nested) for item in data["items"])
        if tag == "set":
            return {_frozen(decode(item, nested)) for item in data["items"]}
        if tag == "dict":
            return {_frozen(decode(k, nested)): decode(v, nested) for k, v in data["items"]}
        if tag in ("ndarray", "npscalar"):
            raw = base64.b64decode(data["npy"], validate=True)
            array = np.load(io.BytesIO(raw), allow_pickle=False)
            return array if tag == "ndarray" else array[()]
        if tag == "float":
            if data["repr"] not in ("nan", "inf", "-inf"):
                raise WireError(f"malformed float {data['repr']!r}")
            return float(data["repr"])
        if tag == "int":
            return int(data["hex"], 16)
        if tag == "complex":
            return complex(decode(data["re"], nested), decode(data["im"], nested))
        if tag == "bytes":
            return base64.b64decode(data["b64"], validate=True)
        if tag == "opaque":
            return Opaque(str(data["type"]), str(data["repr"]))
        if tag == "raised":
            return Raised(str(data["type"]), tuple(map(str, data["bases"])), str(data["message"]))
    except WireError:
        raise
    except Exception as error:  # a missing key, bad base64, a bad .npy header
        raise WireError(f"malformed {tag} in the result: {type(error).__name__}") from None
    raise WireError(f"malformed result: unknown tag {tag!r}")
