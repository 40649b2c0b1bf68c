"""The guard's profile hook in native code, for the events that need no Python.

While a probe runs, ``Guard`` sees every call and return through a profile hook. Most of these
events need nothing from it: every return, a call of code it has already looked at and found
harmless, a C call made by the library's own code. A Python hook still costs a Python call per
event (about twice the plain run for a probe that makes many small calls). Here a small C
function answers those events itself and hands every other one to the guard's Python hook as
``python(frame, event, arg)``, the call ``sys.setprofile`` would have made. It is compiled once
per process with llvmlite (the LLVM binding Numba is built on; about 10 ms) and installed with
``PyEval_SetProfile``.

It answers an event itself only when the Python hook, given it, would do nothing. It reads that
from tables the guard fills as it classifies code (``Tables``):

==============  ============================================================================
event           answered here when
==============  ============================================================================
return,         always: the Python hook ignores them
c_return,
c_exception
call            the code is in ``quiet``; or it is in ``stdlib`` (a standard-library function
                the exercise does not permit, refused only when the student's code calls it
                directly) and the calling frame's code is not in ``student``
c_call          the function is not in ``c_ids`` (C functions the guard watches by identity),
                no C function is forbidden by name (the ``ALL_C`` flag), and: the probe is not
                closed, or the calling code is not in ``student``, or the function's (method
                definition, owner, module) is in ``c_permitted``
==============  ============================================================================

The ``CLOSING`` flag (the guard is being switched on or off) sends every call and c_call to
Python. The tables are open-addressing hash sets of addresses in numpy arrays; the guard holds
the objects whose addresses they list, so an address is never reused while it is listed.

``sys.getprofile()`` returns the hook's ``Hook`` object, which is also callable (as the Python
hook), so the guard's checks of ``sys.getprofile() is hook`` and a thread given the hook through
``threading.setprofile`` work as with a Python hook. Where the native hook cannot be built (no
llvmlite, an interpreter whose object layout differs from what ``_layout_holds`` checks, or
``MLSYS_LAB_GUARD_HOOK=python`` in the environment), ``build()`` returns None and the guard uses
its Python hook alone.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
import threading
from typing import Any

import numpy as np

#: Control block words (an int64 array the hook reaches through ``Hook.control``).
FLAGS, PYTHON = 0, 1
QUIET, STDLIB, STUDENT, C_IDS, C_PERMITTED = 2, 4, 6, 8, 10  # each: (table address, mask)
WORDS = 12
#: Flag bits.
CLOSING, ALL_C, CLOSED = 1, 2, 4

_PY_TRACE_CALL, _PY_TRACE_C_CALL = 0, 4
_EVENTS = ("call", "c_call")  # the strings the Python hook is given (kept alive here)
_BUILT: dict[str, Any] = {}
_LOCK = threading.Lock()


class Hook:
    """What ``sys.getprofile()`` returns while the native hook is on: the control block the
    native function reads (``control``, at a fixed offset it checks) and the guard's Python
    hook, which calling this object runs."""

    __slots__ = ("control", "python")

    def __init__(self, python):
        self.control = np.zeros(WORDS, np.int64)
        self.control[FLAGS] = CLOSING
        self.control[PYTHON] = id(python)
        self.python = python

    def __call__(self, frame, event, arg):
        return self.python(frame, event, arg)


class Tables:
    """The tables a ``Hook``'s native function reads, kept by the guard as it classifies code."""

    def __init__(self, hook: Hook):
        control = hook.control
        self.quiet = _Table(control, QUIET, 1)
        self.stdlib = _Table(control, STDLIB, 1)
        self.student = _Table(control, STUDENT, 1)
        self.c_ids = _Table(control, C_IDS, 1)
        self.c_permitted = _Table(control, C_PERMITTED, 3)
        self._control = control

    def saved(self) -> dict:
        """What the tables hold now, for ``load`` into another hook's tables (the guard keeps
        it per kernel for the next guard of the same plan)."""
        return {name: (t.keys, t.count, t.held) for name, t in self._named().items()}

    def load(self, saved: dict) -> None:
        """Fill these (still empty) tables with copies of what ``saved`` held."""
        for name, table in self._named().items():
            keys, count, held = saved[name]
            table.keys, table.size, table.count = keys.copy(), len(keys) // table.width, count
            table.held = list(held)
            table._publish()

    def _named(self) -> dict[str, _Table]:
        return {"quiet": self.quiet, "stdlib": self.stdlib, "student": self.student,
                "c_permitted": self.c_permitted}

    def flag(self, bit: int, on: bool) -> None:
        if on:
            self._control[FLAGS] |= bit
        else:
            self._control[FLAGS] &= ~bit

    def permit_c(self, builtin: Any) -> None:
        """Note that the student's code may call C function ``builtin`` (its verdict, kept by
        method definition, owner and module, is "permitted"): later calls are answered natively.
        The owner is ``__self__`` when it is a class or a module, else its class, as the guard's
        ``_on_c_call`` keys its verdicts; the table holds the objects it lists."""
        words = (ctypes.c_int64 * 5).from_address(id(builtin))
        method, self_, module = words[2], words[3], words[4]
        owner = builtin.__self__
        if self_ and not issubclass(type(owner), (type, type(sys))):
            owner = type(owner)
            self_ = id(owner)
        self.c_permitted.add((method, self_, module), hold=(owner, builtin.__module__))


class _Table:
    """An open-addressing hash set of ``width``-word keys (addresses) in a numpy array, at most
    half full, published to the control block as (address, mask). Keys are added from Python
    only. A full table is replaced by one four times larger, filled before it is published, the
    address before the mask: a native reader in another thread that sees the new address with
    the old mask probes a prefix of the new table, which holds fewer keys than it has slots, so
    it ends at an empty slot (a miss sends the event to Python, which is always safe). Replaced
    arrays are kept alive."""

    def __init__(self, control: np.ndarray, slot: int, width: int):
        self.control, self.slot, self.width = control, slot, width
        self.held: list = []
        self._old: list[np.ndarray] = []
        self.keys, self.size, self.count = np.zeros(16 * width, np.int64), 16, 0
        self._publish()

    def _publish(self) -> None:
        self.control[self.slot] = self.keys.ctypes.data
        self.control[self.slot + 1] = self.size - 1

    def add(self, key: int | tuple, hold: Any = None) -> None:
        key = (key,) if isinstance(key, int) else tuple(key)
        if 2 * (self.count + 1) > self.size:
            rows = self.keys.reshape(-1, self.width)
            grown = np.zeros(4 * self.size * self.width, np.int64)
            count = sum(_put(grown, self.width, tuple(row)) for row in
                        rows[rows[:, 0] != 0].tolist())
            self._old.append(self.keys)
            self.keys, self.size, self.count = grown, 4 * self.size, count
            self._publish()
        self.count += _put(self.keys, self.width, key)
        if hold is not None:
            self.held.append(hold)

    def clear(self) -> None:
        self.keys[:] = 0  # one C call: a reader sees the table before or after
        self.count = 0
        self.held.clear()


def _put(keys: np.ndarray, width: int, key: tuple) -> bool:
    """Insert ``key`` by linear probing from ``_hash``; whether it was new. (The guard adds a
    key for each code object it classifies: the slots are read as Python ints, ``item``, not
    sliced into arrays.)"""
    mask = len(keys) // width - 1
    i = _hash(key) & mask
    item = keys.item
    while True:
        at = i * width
        first = item(at)
        if first == 0:
            keys[at:at + width] = key
            return True
        if first == key[0] and (width == 1 or all(
                item(at + j) == key[j] for j in range(1, width))):
            return False
        i = (i + 1) & mask


def _hash(key: tuple) -> int:
    """The slot hash the native lookups use: the words' bits above the allocator's alignment."""
    h = key[0] >> 16
    for word in key:
        h ^= word >> 4
    return h


def build() -> dict | None:
    """Compile the native hook (once per process): ``{"address": ..., "engine": ..., "events":
    ...}`` (the function's address, and what must stay alive as long as it is used), or None
    where it is not available. ``guard.seal`` keeps the result in the seal, which the grader's
    private copies of this module read instead of compiling again."""
    if "built" not in _BUILT:
        with _LOCK:
            if "built" not in _BUILT:
                try:
                    _BUILT["built"] = _build() if _wanted() and _layout_holds() else None
                except Exception as error:  # llvmlite missing, or it cannot compile here
                    _BUILT["error"] = f"{type(error).__name__}: {error}"
                    _BUILT["built"] = None
    return _BUILT["built"]


def install(address: int, hook: Hook) -> None:
    """Make ``hook`` this thread's profile function: the native function at ``address``."""
    _setter("PyEval_SetProfile")(address, hook)


def install_all_threads(address: int, hook: Hook) -> None:
    """Python 3.12+: make ``hook`` every running thread's profile function (natively)."""
    _setter("PyEval_SetProfileAllThreads")(address, hook)


def _setter(name: str):
    """``PyEval_SetProfile`` or its all-threads twin, typed once (holding the GIL, as
    ``ctypes.pythonapi`` does): (function, object) -> None."""
    fn = _BUILT.get(name)
    if fn is None:
        fn = _BUILT[name] = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.py_object)(
            (name, ctypes.pythonapi))
    return fn


#: Words the seal reads to see that nothing changed (``gatherer``): a dict's version (CPython
#: gives every dict a new one at each change, PEP 509; still kept in 3.13) and a function's
#: code, defaults and keyword defaults.
WORD_LAYOUT = {"dict_version": 3, "function_code": 6, "function_defaults": 7,
               "function_kwdefaults": 8}


def gatherer(built: dict | None):
    """``gather(addresses, out, n)`` (ctypes arrays of int64) reading the word at each address,
    or None where the native module is not built or ``WORD_LAYOUT`` does not hold here."""
    if built is None or not _words_hold():
        return None
    pointer = ctypes.POINTER(ctypes.c_int64)
    return ctypes.CFUNCTYPE(None, pointer, pointer, ctypes.c_int64)(built["gather"])


def _words_hold() -> bool:
    """Whether ``WORD_LAYOUT`` describes this interpreter: a dict's version changes when it
    does and only then, a class's and a module's namespace too, and a function's fields are
    where it says."""
    import gc
    import types

    at = WORD_LAYOUT
    d, other = {"a": 1}, {}
    before = _word(id(d), at["dict_version"])
    other["x"] = 1
    unchanged = _word(id(d), at["dict_version"]) == before
    d["a"] = 2
    changed = _word(id(d), at["dict_version"]) != before

    class Probe:
        pass

    space = gc.get_referents(vars(Probe))
    if len(space) != 1 or type(space[0]) is not dict:
        return False
    cls_before = _word(id(space[0]), at["dict_version"])
    Probe.x = 1
    module = types.ModuleType("probe")
    mod_before = _word(id(vars(module)), at["dict_version"])
    module.x = 1

    def f(a=1, *, b=2):
        return a + b

    return (unchanged and changed and _word(id(space[0]), at["dict_version"]) != cls_before
            and _word(id(vars(module)), at["dict_version"]) != mod_before
            and _word(id(f), at["function_code"]) == id(f.__code__)
            and _word(id(f), at["function_defaults"]) == id(f.__defaults__)
            and _word(id(f), at["function_kwdefaults"]) == id(f.__kwdefaults__))


def _wanted() -> bool:
    return (os.environ.get("MLSYS_LAB_GUARD_HOOK", "native") != "python"
            and not sysconfig.get_config_var("Py_GIL_DISABLED")
            and sys.maxsize == 2 ** 63 - 1)


def _word(address: int, index: int) -> int:
    return ctypes.c_int64.from_address(address + 8 * index).value


def _layout_holds() -> bool:
    """Whether the object layouts the native function reads are what it assumes: an object's
    type at word 1; ``Hook.control`` at word 2 of a ``Hook``; an array's data at word 2; a C
    function's method definition (whose first word is its name), ``__self__`` and ``__module__``
    at words 2, 3 and 4."""
    hook = Hook(print)
    bound, other = [].append, [].append
    return (_word(id(hook), 1) == id(Hook) and _word(id(hook), 2) == id(hook.control)
            and _word(id(hook.control), 2) == hook.control.ctypes.data
            and _word(id(len), 3) == id(len.__self__) and _word(id(len), 4) == id(len.__module__)
            and _word(id(bound), 3) == id(bound.__self__) and _word(id(bound), 4) == 0
            and _word(id(bound), 2) == _word(id(other), 2) != _word(id([].pop), 2)
            # read last, once the words around it are what they should be: a pointer
            and ctypes.c_char_p.from_address(_word(id(bound), 2)).value == b"append")


_SYMBOLS = {  # name: (return type, argument types), in the IR's terms
    "PyFrame_GetCode": ("ptr", ("ptr",)),
    "PyFrame_GetBack": ("ptr", ("ptr",)),
    "Py_IncRef": ("void", ("ptr",)),
    "Py_DecRef": ("void", ("ptr",)),
    "PyTuple_New": ("ptr", ("i64",)),
    "PyTuple_SetItem": ("i32", ("ptr", "i64", "ptr")),
    "PyObject_Call": ("ptr", ("ptr", "ptr", "ptr")),
}


def _build() -> dict:
    """Compile the hook (see the module docstring)."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
    ptr = ir.IntType(8).as_pointer()
    words = i64.as_pointer()
    kinds = {"ptr": ptr, "i64": i64, "i32": i32, "void": ir.VoidType()}
    module = ir.Module(name="mlsys_lab_guard_hook")
    api = {}
    for name, (ret, args) in _SYMBOLS.items():
        api[name] = ir.Function(module, ir.FunctionType(kinds[ret], [kinds[a] for a in args]),
                                name=name)
        llvm.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)

    def const(value: int):
        return ir.Constant(i64, value)

    def lookup(width: int) -> ir.Function:
        """``i1 has(i64* control, i64 slot, i64 key...)``: whether the table in ``slot`` lists
        the key (linear probing from ``_hash``; an empty slot ends the search)."""
        fn = ir.Function(module, ir.FunctionType(i1, [words, i64] + [i64] * width),
                         name=f"has{width}")
        fn.linkage = "internal"
        control, slot, *key = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        table = b.inttoptr(b.load(b.gep(control, [slot])), words)
        mask = b.load(b.gep(control, [b.add(slot, const(1))]))
        h = b.lshr(key[0], const(16))
        for k in key:
            h = b.xor(h, b.lshr(k, const(4)))
        start = b.and_(h, mask)
        entry = b.block
        loop, empty, step, yes, no = (fn.append_basic_block(n) for n in (
            "loop", "empty", "step", "yes", "no"))
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(start, entry)
        row = b.mul(i, const(width))
        found = [b.load(b.gep(table, [b.add(row, const(j))])) for j in range(width)]
        same = b.icmp_unsigned("==", found[0], key[0])
        for j in range(1, width):
            same = b.and_(same, b.icmp_unsigned("==", found[j], key[j]))
        b.cbranch(same, yes, empty)
        b.position_at_end(empty)
        b.cbranch(b.icmp_unsigned("==", found[0], const(0)), no, step)
        b.position_at_end(step)
        following = b.and_(b.add(i, const(1)), mask)
        i.add_incoming(following, step)
        b.branch(loop)
        b.position_at_end(yes)
        b.ret(ir.Constant(i1, 1))
        b.position_at_end(no)
        b.ret(ir.Constant(i1, 0))
        return fn

    has1, has3 = lookup(1), lookup(3)
    hook = ir.Function(module, ir.FunctionType(i32, [ptr, ptr, i32, ptr]),
                       name="mlsys_lab_guard_hook")
    obj, frame, what, arg = hook.args
    blocks = {n: hook.append_basic_block(n) for n in (
        "entry", "control", "call", "call_known", "call_stdlib", "call_back", "call_caller",
        "c_call", "c_call_unwatched", "c_call_closed", "c_call_student", "c_call_self",
        "c_call_type", "c_call_type_listed", "slow", "slow_fill", "slow_done", "done",
        "error")}
    b = ir.IRBuilder(blocks["entry"])

    def at(name):
        b.position_at_end(blocks[name])

    def word(address, index):
        return b.load(b.gep(b.bitcast(address, words), [const(index)]))

    def code_of(f):  # a borrowed reference: the frame holds its code
        code = b.call(api["PyFrame_GetCode"], [f])
        b.call(api["Py_DecRef"], [code])
        return b.ptrtoint(code, i64)

    def branch(condition, then, otherwise):
        b.cbranch(condition, blocks[then], blocks[otherwise])

    def is_null(pointer):
        return b.icmp_unsigned("==", b.ptrtoint(pointer, i64), const(0))

    def flag(bits):
        return b.icmp_unsigned("!=", b.and_(flags, const(bits)), const(0))

    def listed(table, *key):
        return b.call(has1 if len(key) == 1 else has3, [control, const(table), *key])

    is_call = b.icmp_signed("==", what, ir.Constant(i32, _PY_TRACE_CALL))
    is_c_call = b.icmp_signed("==", what, ir.Constant(i32, _PY_TRACE_C_CALL))
    branch(b.or_(is_call, is_c_call), "control", "done")

    at("control")  # the Hook's control array, then that array's data
    control = b.inttoptr(word(b.inttoptr(word(obj, 2), ptr), 2), words)
    flags = b.load(control)
    branch(is_call, "call", "c_call")

    at("call")
    branch(flag(CLOSING), "slow", "call_known")
    at("call_known")
    code = code_of(frame)
    branch(listed(QUIET, code), "done", "call_stdlib")
    at("call_stdlib")
    branch(listed(STDLIB, code), "call_back", "slow")
    at("call_back")
    back = b.call(api["PyFrame_GetBack"], [frame])  # a new reference; NULL at a thread's start
    branch(is_null(back), "slow", "call_caller")
    at("call_caller")
    caller = code_of(back)
    b.call(api["Py_DecRef"], [back])
    branch(listed(STUDENT, caller), "slow", "done")

    at("c_call")
    branch(flag(CLOSING | ALL_C), "slow", "c_call_unwatched")
    at("c_call_unwatched")
    branch(listed(C_IDS, b.ptrtoint(arg, i64)), "slow", "c_call_closed")
    at("c_call_closed")
    branch(flag(CLOSED), "c_call_student", "done")
    at("c_call_student")
    branch(listed(STUDENT, code_of(frame)), "c_call_self", "done")
    at("c_call_self")  # a PyCFunctionObject: its method definition, __self__, __module__
    method, self_, owner_module = (word(arg, i) for i in (2, 3, 4))
    branch(listed(C_PERMITTED, method, self_, owner_module), "done", "c_call_type")
    at("c_call_type")
    branch(b.icmp_unsigned("==", self_, const(0)), "slow", "c_call_type_listed")
    at("c_call_type_listed")
    owner_type = word(b.inttoptr(self_, ptr), 1)
    branch(listed(C_PERMITTED, method, owner_type, owner_module), "done", "slow")

    at("slow")  # hand the event to the Python hook: python(frame, event, arg)
    event = b.select(is_call, b.inttoptr(const(id(_EVENTS[0])), ptr),
                     b.inttoptr(const(id(_EVENTS[1])), ptr))
    given = b.select(is_null(arg), b.inttoptr(const(id(None)), ptr), arg)
    args = b.call(api["PyTuple_New"], [const(3)])
    branch(is_null(args), "error", "slow_fill")
    at("slow_fill")
    for position, item in enumerate((frame, event, given)):
        b.call(api["Py_IncRef"], [item])  # PyTuple_SetItem steals a reference
        b.call(api["PyTuple_SetItem"], [args, const(position), item])
    python = b.inttoptr(b.load(b.gep(control, [const(PYTHON)])), ptr)
    result = b.call(api["PyObject_Call"], [python, args, ir.Constant(ptr, None)])
    b.call(api["Py_DecRef"], [args])
    branch(is_null(result), "error", "slow_done")
    at("slow_done")
    b.call(api["Py_DecRef"], [result])
    b.branch(blocks["done"])
    at("done")
    b.ret(ir.Constant(i32, 0))
    at("error")  # the Python hook raised: the exception propagates into the probed code
    b.ret(ir.Constant(i32, -1))

    # void gather(i64* addresses, i64* out, i64 n): out[i] = the word at addresses[i] (the
    # seal's fast comparison reads dict versions and function fields with it: ``WORD_LAYOUT``).
    gather = ir.Function(module, ir.FunctionType(ir.VoidType(), [words, words, i64]),
                         name="mlsys_lab_gather")
    addresses, out, n = gather.args
    entry, loop, step, end = (gather.append_basic_block(name) for name in (
        "entry", "loop", "step", "end"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(const(0), entry)
    b.cbranch(b.icmp_signed("<", i, n), step, end)
    b.position_at_end(step)
    source = b.inttoptr(b.load(b.gep(addresses, [i])), words)
    b.store(b.load(source), b.gep(out, [i]))
    i.add_incoming(b.add(i, const(1)), step)
    b.branch(loop)
    b.position_at_end(end)
    b.ret_void()

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(opt=0)
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    # The machine code lives as long as the engine; the event strings are baked into it.
    return {"address": engine.get_function_address("mlsys_lab_guard_hook"), "engine": engine,
            "events": _EVENTS, "gather": engine.get_function_address("mlsys_lab_gather")}
