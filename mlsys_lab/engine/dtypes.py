"""Dtypes: the ones mlsys_lab supports, their short names, and how binary ops promote them.

``int8`` is supported for quantised data (QDQ models: int8 weights, :mod:`mlsys_lab.deploy
.quantize`). It promotes as in PyTorch and numpy except that there is no int16: ``int8`` with
``uint8`` gives ``int32``, the smallest supported dtype holding both ranges (never one of the
two, which would wrap values of the other).
"""

import numpy as np

from ..errors import DTypeError, DTypeOverflowError

SHORT = {"bool": "bool", "uint8": "u8", "int8": "i8", "int32": "i32", "int64": "i64",
         "float16": "f16", "float32": "f32", "float64": "f64"}
#: The supported dtypes, from lowest to highest promotion rank.
SUPPORTED = tuple(np.dtype(d) for d in SHORT)
_RANK = {d: i for i, d in enumerate(SUPPORTED)}

float32 = np.dtype("float32")
float64 = np.dtype("float64")
float16 = np.dtype("float16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
int8 = np.dtype("int8")
bool_ = np.dtype("bool")


def as_dtype(d, op="tensor"):
    """Normalise ``d`` (a name, numpy dtype or type) to a supported numpy dtype."""
    try:
        dt = np.dtype(d)
    except TypeError as e:
        raise DTypeError(f"{op}: {d!r} is not a dtype") from e
    if dt not in _RANK:
        names = ", ".join(SHORT)
        raise DTypeError(f"{op}: dtype {dt} is not supported (supported: {names})")
    return dt


def short(dt):
    """Short name used when printing the IR: float32 -> f32."""
    return SHORT.get(np.dtype(dt).name, np.dtype(dt).name)


def is_float(dt):
    """Whether ``dt`` is a floating dtype."""
    return np.dtype(dt).kind == "f"


def promote(a, b):
    """Result dtype of a binary elementwise op (PyTorch-like: any float beats any integer;
    ``int8`` with ``uint8`` gives ``int32``, see the module's docstring)."""
    if a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa != fb:
        return a if fa else b
    if {a, b} == {int8, uint8}:
        return int32
    return a if _RANK[a] >= _RANK[b] else b


def default_dtype_for(value):
    """The dtype a Python value becomes: floats -> float32, ints -> int64, bools -> bool."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    return float32


def weak_dtype(scalar, other):
    """dtype a Python scalar takes next to a tensor of dtype ``other`` (scalars are 'weak')."""
    if isinstance(scalar, (bool, np.bool_)):
        return other
    if isinstance(scalar, (int, np.integer)):
        return other if other != bool_ else int64
    return other if is_float(other) else float32


def scalar_array(value, dt, op="tensor"):
    """A 0-d array of dtype ``dt`` holding the Python scalar ``value``, refusing values that do
    not fit (an integer outside the dtype's range, an int too large for a float) instead of
    wrapping them as a cast would.

    Raises:
        DTypeOverflowError: naming the op, the value and the dtype.
    """
    dt = np.dtype(dt)
    if dt.kind in "iu" and isinstance(value, (int, np.integer)) and not isinstance(
            value, (bool, np.bool_)):
        info = np.iinfo(dt)
        if not info.min <= int(value) <= info.max:
            raise DTypeOverflowError(f"{op}: the value {show_int(value)} does not fit in {dt} "
                                     f"(range {info.min}..{info.max}); cast the tensor "
                                     f"first, e.g. ml.ops.cast(t, 'float64')")
    try:
        return np.asarray(value, dtype=dt)
    except OverflowError as e:
        raise DTypeOverflowError(f"{op}: the value {show_int(value)} does not fit in {dt} "
                                 f"({e})") from None


def show_int(value):
    """A number for an error message, with huge integers shortened to their leading digits."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:8]}...({len(text.lstrip('-'))} digits)"


def ulp_distance(a, b):
    """Elementwise distance between two float arrays of one dtype in ulps: how many
    representable values lie between them (``-0.`` and ``+0.`` are 1 apart, the smallest
    subnormal is 1 from zero, ``inf`` is 1 above the largest finite value). Two NaNs are 0
    apart, a NaN and a number ``inf``.

    Returns:
        A float64 array of the broadcast shape (exact up to 2**53 ulps).
    """
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    if a.dtype != b.dtype or a.dtype.kind != "f":
        raise TypeError(f"ulp_distance: expects two float arrays of one dtype, got {a.dtype} "
                        f"and {b.dtype}")
    ints = np.dtype(f"i{a.dtype.itemsize}")
    mask = np.iinfo(ints).max

    def ordered(x):  # the bit pattern as an int that grows with the float's value
        bits = np.ascontiguousarray(x).view(ints).astype(np.int64)
        return np.where(bits < 0, -(bits & mask) - 1, bits)

    ka, kb = ordered(a), ordered(b)
    hi, lo = np.maximum(ka, kb).astype(np.uint64), np.minimum(ka, kb).astype(np.uint64)
    d = (hi - lo).astype(np.float64)  # modular uint64 arithmetic: exact, no overflow
    na, nb = np.isnan(a), np.isnan(b)
    d[na | nb] = np.inf
    d[na & nb] = 0.0
    return d
