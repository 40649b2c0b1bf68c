"""Dtypes: the ones mlsys_lab supports, their short names, and how binary ops promote them.

Two tiers:

* **Compute dtypes** (:data:`COMPUTE`): bool, the integers int8/16/32/64 and uint8/16/32/64,
  float16/32/64. Every op that computes takes them (float-only ops refuse the integers).
* **Storage dtypes** (:data:`STORAGE`, from the ``ml_dtypes`` package): bfloat16, the float8
  formats (float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu),
  float4_e2m1fn and the sub-byte integers int4/uint4/int2/uint2. A Tensor or graph value may
  hold them, and the ops that only move or convert data take them (those defined with
  ``defop(..., storage=True)``: ``cast``, ``identity``, ``reshape``, ``transpose``,
  ``concatenate``, ``getitem``, ``take``, ``where``, ``quantize_linear``'s output,
  ``dequantize_linear``'s input, ...). Every other op refuses them with a DTypeError naming the
  op and the dtype (:func:`refuse_storage`, applied by
  :func:`~mlsys_lab.engine.registry.defop`): cast to float32 first. The ONNX importer
  does that cast for bfloat16 the way ONNX's reference runtime computes bfloat16 (in float32,
  each op's result rounded back to bfloat16). ``cast`` to them is numpy's / ml_dtypes'
  ``astype``: round to nearest even; out-of-range floats become NaN (e4m3fn, the fnuz
  formats, e8m0) or inf (e5m2), as ONNX's ``Cast`` with ``saturate=0``; sub-byte integers
  wrap (int4: 8 -> -8) as ONNX's reference does.

Promotion (:func:`promote`) of two compute dtypes follows numpy and PyTorch where they agree:

* bool with anything gives the other dtype;
* an integer with a float gives the float (PyTorch; numpy widens ``int16 + float16`` to
  float32 -- a documented choice: mlsys_lab never widens a float because of an integer);
* two floats, or two integers of one signedness, give the wider;
* a signed and an unsigned integer give the narrowest signed integer holding both ranges:
  ``int8 + uint8 -> int16``, ``int16 + uint16 -> int32``, ``int32 + uint32 -> int64``,
  ``int64 + uint8 -> int64`` (numpy; PyTorch has no promotion for uint16/32/64 at all);
* ``uint64`` with a signed integer has no such integer: numpy gives float64 (losing
  integers above 2**53), PyTorch raises; mlsys_lab raises a DTypeError (cast one side).

Storage dtypes promote only with themselves (``promote(bf16, bf16) == bf16``); with any
other dtype :func:`promote` raises a DTypeError.
"""

import sys
import threading

import numpy as np

from ..errors import DTypeError, DTypeOverflowError

SHORT = {"bool": "bool", "uint8": "u8", "int8": "i8", "int16": "i16", "uint16": "u16",
         "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
         "float16": "f16", "float32": "f32", "float64": "f64"}
#: The storage-only dtypes (ml_dtypes) and their short names in the IR.
STORAGE_SHORT = {"bfloat16": "bf16", "float8_e4m3fn": "f8e4m3", "float8_e4m3fnuz": "f8e4m3fnuz",
                 "float8_e5m2": "f8e5m2", "float8_e5m2fnuz": "f8e5m2fnuz",
                 "float8_e8m0fnu": "f8e8m0", "float4_e2m1fn": "f4e2m1", "int4": "i4",
                 "uint4": "u4", "int2": "i2", "uint2": "u2"}
#: The dtypes every computing op takes.
COMPUTE = tuple(np.dtype(d) for d in SHORT)
_FLOATS = frozenset({np.dtype("float16"), np.dtype("float32"), np.dtype("float64")})
_ALL_SHORT = {**SHORT, **STORAGE_SHORT}

float32 = np.dtype("float32")
float64 = np.dtype("float64")
float16 = np.dtype("float16")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
uint16 = np.dtype("uint16")
uint32 = np.dtype("uint32")
uint64 = np.dtype("uint64")
int8 = np.dtype("int8")
bool_ = np.dtype("bool")
_BY_NAME = {d.name: d for d in COMPUTE}
_BY_NAME.update({SHORT[d.name]: d for d in COMPUTE if SHORT[d.name] != "bool"})

# --- the storage dtypes, made on first use -------------------------------------------------
# Importing ml_dtypes costs about a second (its compiled extension registers the dtypes with
# numpy), most of `import mlsys_lab`, and only the storage dtypes need it. So the names below
# (STORAGE, STORAGE_FLOATS, SUPPORTED, bfloat16, float8_e4m3fn, ..., uint2) are made by
# _load_storage() the first time one is read (module __getattr__), a storage name is given
# (as_dtype("bf16")) or anyone imports ml_dtypes (_OnMlDtypesImport: its dtypes exist only from
# then on, so an array the user made with ml_dtypes is known before it reaches an op).
# Membership tests run on every op call: hashed sets (a tuple compares dtypes one by one),
# filled in place when the dtypes are made, so the hot path stays one set lookup.
_STORAGE_SET, _STORAGE_FLOAT_SET = set(), set()
#: Whether the storage dtypes are still to be made.
_UNLOADED = True
_LOAD_LOCK = threading.RLock()
_STORAGE_NAMES = frozenset(STORAGE_SHORT) | frozenset(STORAGE_SHORT.values())
_LAZY_NAMES = frozenset(STORAGE_SHORT) | {"STORAGE", "STORAGE_FLOATS", "SUPPORTED", "ml_dtypes"}
#: numpy numbers user-defined dtypes from NPY_USERDEF on; ml_dtypes' are all such.
_USERDEF = 256


def _load_storage(ml_dtypes=None):
    """Import ml_dtypes (unless given the module) and make the storage dtypes and the tuples
    that hold them (idempotent, thread-safe)."""
    global _UNLOADED
    if not _UNLOADED:
        return
    if ml_dtypes is None:
        import ml_dtypes  # outside the lock: the import itself calls back here
    with _LOAD_LOCK:
        if not _UNLOADED:
            return
        storage = tuple(np.dtype(getattr(ml_dtypes, d)) for d in STORAGE_SHORT)
        floats = tuple(d for d in storage if not d.name.startswith(("int", "uint")))
        names = globals()
        names.update({name: d for name, d in zip(STORAGE_SHORT, storage)})
        names.update(ml_dtypes=ml_dtypes, STORAGE=storage, STORAGE_FLOATS=floats,
                     SUPPORTED=COMPUTE + storage)
        _BY_NAME.update({d.name: d for d in storage})
        _BY_NAME.update({STORAGE_SHORT[d.name]: d for d in storage})
        _STORAGE_FLOAT_SET.update(floats)
        _STORAGE_SET.update(storage)
        _UNLOADED = False


class _OnMlDtypesImport:
    """An entry of ``sys.meta_path`` that makes the storage dtypes right after anyone imports
    ml_dtypes (it finds the module with the finders after it and runs ``_load_storage`` when the
    module has run), then leaves ``sys.meta_path``."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "ml_dtypes":
            return None
        cls.remove()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _load_storage(module)

        loader.exec_module = exec_module  # this module's own loader object
        return spec

    @classmethod
    def remove(cls):
        """Leave ``sys.meta_path`` (idempotent)."""
        sys.meta_path[:] = [f for f in sys.meta_path if f is not cls]


if "ml_dtypes" in sys.modules:  # imported already: making the dtypes costs nothing more
    _load_storage(sys.modules["ml_dtypes"])
elif _OnMlDtypesImport not in sys.meta_path:
    sys.meta_path.insert(0, _OnMlDtypesImport)


def __getattr__(name):
    """The storage dtypes' names (``dtypes.bfloat16``, ``dtypes.STORAGE``, ``dtypes.SUPPORTED``,
    ...), made on first use."""
    if name in _LAZY_NAMES:
        _load_storage()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY_NAMES)


def _in_storage(dt, members):
    """``dt in members`` (one of the storage sets). A safety net for paths off the ops' hot one:
    a user-defined numpy dtype (as ml_dtypes' are) met while the storage dtypes are not made
    (ml_dtypes imported past :class:`_OnMlDtypesImport`, by an import hook placed before it)
    makes them first."""
    if dt in members:
        return True
    if _UNLOADED and getattr(dt, "num", 0) >= _USERDEF:
        _load_storage()
        return dt in members
    return False


def as_dtype(d, op="tensor"):
    """Normalise ``d`` (a name such as ``"float32"``, ``"bfloat16"`` or a short name such as
    ``"bf16"``, a numpy dtype or type) to a supported numpy dtype."""
    if isinstance(d, str):
        if d in _BY_NAME:
            return _BY_NAME[d]
        if _UNLOADED and d in _STORAGE_NAMES:
            _load_storage()
            return _BY_NAME[d]
    try:
        dt = np.dtype(d)
    except TypeError as e:
        raise DTypeError(f"{op}: {d!r} is not a dtype") from e
    if dt not in _BY_NAME.values() and not _in_storage(dt, _STORAGE_SET):
        names = ", ".join(_ALL_SHORT)
        raise DTypeError(f"{op}: dtype {dt} is not supported (supported: {names})")
    return dt


def short(dt):
    """Short name used when printing the IR: float32 -> f32, bfloat16 -> bf16."""
    name = np.dtype(dt).name
    return _ALL_SHORT.get(name, name)


def is_float(dt):
    """Whether ``dt`` is a floating compute dtype (float16/32/64; the storage formats such as
    bfloat16 are not: see :func:`is_storage`)."""
    return np.dtype(dt) in _FLOATS


def is_storage(dt):
    """Whether ``dt`` is a storage-only dtype (bfloat16, float8, float4, int4/2, uint4/2)."""
    return _in_storage(np.dtype(dt), _STORAGE_SET)


def is_storage_float(dt):
    """Whether ``dt`` is one of the floating storage formats (bfloat16, float8, float4)."""
    return _in_storage(np.dtype(dt), _STORAGE_FLOAT_SET)


def refuse_storage(op_name, avals):
    """Raise the DTypeError for an op that does not take storage dtypes given one."""
    for a in avals:
        dt = getattr(a, "dtype", None)
        if dt is not None and _in_storage(dt if isinstance(dt, np.dtype) else np.dtype(dt),
                                          _STORAGE_SET):
            raise DTypeError(f"{op_name}: dtype {np.dtype(dt).name} ({short(dt)}) is a storage "
                             f"dtype that only data-movement and conversion ops take; cast it "
                             f"first, e.g. ml.ops.cast(x, 'float32')")


def storage_guarded(op_name, infer):
    """``infer`` wrapped to refuse storage dtypes first (what ``defop`` does for every op not
    defined with ``storage=True``)."""
    def guarded(*avals, **attrs):
        for a in avals:
            if getattr(a, "dtype", None) in _STORAGE_SET:
                refuse_storage(op_name, avals)
        return infer(*avals, **attrs)
    guarded.__wrapped__ = infer
    guarded.__name__ = getattr(infer, "__name__", "infer")
    guarded.__doc__ = getattr(infer, "__doc__", None)
    return guarded


def check_storage_range(data, dt, op="tensor"):
    """Refuse Python data with a number outside the range of the sub-byte integer ``dt``
    (numpy refuses ``200`` for int8, but ml_dtypes wraps ``9`` to ``-7`` for int4); other
    dtypes pass.

    Raises:
        DTypeOverflowError: naming ``op``, the value and the dtype's range.
    """
    dt = np.dtype(dt)
    if not _in_storage(dt, _STORAGE_SET) or dt in _STORAGE_FLOAT_SET or isinstance(
            data, np.ndarray):
        return
    try:
        values = np.asarray(data, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return  # not numeric: the conversion itself reports it
    import ml_dtypes  # imported already: dt is one of its dtypes

    info = ml_dtypes.iinfo(dt)
    bad = values[(values < info.min) | (values > info.max)]
    if bad.size:
        v = int(bad[0]) if float(bad[0]).is_integer() else float(bad[0])
        raise DTypeOverflowError(f"{op}: the value {show_int(v)} does not fit in {dt.name} "
                                 f"(range {info.min}..{info.max})")


def _bits(dt):
    return np.dtype(dt).itemsize * 8


def promote(a, b):
    """Result dtype of a binary elementwise op (rules in the module's docstring).

    Raises:
        DTypeError: ``uint64`` with a signed integer, or a storage dtype with another dtype.
    """
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    for d in (a, b):
        if d in _STORAGE_SET or _UNLOADED and d.num >= _USERDEF and _in_storage(d, _STORAGE_SET):
            raise DTypeError(f"promote: {a.name} with {b.name}: the storage dtype {d.name} "
                             f"promotes with no other dtype; cast first")
    if a == bool_ or b == bool_:
        return b if a == bool_ else a
    fa, fb = is_float(a), is_float(b)
    if fa != fb:
        return a if fa else b
    if fa or a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    if unsigned == uint64:
        raise DTypeError(f"promote: {a.name} with {b.name}: no integer dtype holds both ranges "
                         f"(numpy would give float64, losing integers above 2**53); cast one "
                         f"side first")
    return np.dtype(f"int{2 * _bits(unsigned)}")


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
