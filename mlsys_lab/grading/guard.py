"""The forbidden-functions guard: while a probe runs the student's code, shortcuts refuse to run.

Each ``Exercise`` names the library functions that would solve it (``forbidden=(...)``, specs
like ``"mlsys_lab.engine.schedule:kahn"``; a wrapper such as a ``@graph_pass`` object, a
``functools.partial`` or a Numba dispatcher stands for the function it wraps), and the grader's
own reference answers — every function in the chapter check modules
(``mlsys_lab/grading/chNN.py``) that the exercise's probes do not use — are added automatically.
``plan_for(exercise)`` turns that into plain data (where each forbidden function's code was
defined, and a fingerprint of its code); the grader computes it in its own process and sends it
to the kernel, ``check()`` computes it in place.

``Guard(plan)`` enforces it in the kernel. While a probe runs (``with guard.watching():``):

* a profile hook (``sys.setprofile``, and ``threading.setprofile`` for threads started meanwhile)
  looks at every function that starts. Code is matched by *where it was defined* (file, first
  line, qualified name) — so saved references, bound methods, ``f = kahn`` and
  ``types.FunctionType(kahn.__code__, ...)`` are all caught — and, for functions big enough to
  be distinctive (``DISTINCTIVE`` instructions), by a fingerprint of their normalised
  instruction stream, so a copy of the library's source pasted into a cell is caught too
  (renamed locals, edited docstrings and messages, with or without the module's imports, at
  module level or nested in a function). A fingerprint is computed once per code object, and
  only for code that is not part of the installed Python or packages. A match raises
  ``OffLimitsError`` and records the refusal; a refusal sticks, so catching the error does not
  help.
* C functions named in the plan (``"math:fsum"``, ``"numpy:ndarray.mean"``) are refused when
  Python code calls them, on any object whose class inherits the method (a call made from C,
  ``map(math.fsum, ...)``, is not seen: prefer to forbid the Python function behind a C entry
  point, or to check what C cannot do).
* Numba: a compiled dispatcher runs native code that no profile hook sees. Every dispatcher whose
  Python function matches the plan, or whose compiled code calls such a dispatcher, has its
  compiled entry points switched off for the duration (calls then fall back into the
  dispatcher's Python methods, which the hook refuses), and its overloads' entry points are
  refused if called directly.
* Switching the guard off — ``sys.setprofile``, ``sys.settrace``, ``threading.setprofile``, their
  ``get`` twins, ``sys.monitoring`` — is recorded as tampering, and so is a profile hook that is
  no longer the guard's when the probe ends.

The guard is a tripwire for every shortcut a notebook offers, not a sandbox: code that walks the
interpreter's frames to rewrite the guard's state, or that hands work to a thread started before
the check (Python < 3.12 cannot watch those), is deliberate reverse engineering and out of scope.
"""

from __future__ import annotations

import dis
import gc
import glob
import hashlib
import importlib
import inspect
import os
import sys
import sysconfig
import threading
import types
import weakref
from typing import Any, Iterable

__all__ = ["Guard", "OffLimitsError", "fingerprint", "plan_for", "unguarded"]

#: Functions with at least this many instructions (normalised, see ``fingerprint``) are also
#: matched by fingerprint, as a pasted copy; smaller ones (``return x * x``, a one-line numpy
#: formula) look like honest answers, so only their origin counts. Counted in instructions, not
#: bytes: Python 3.11's inline caches make ``np.f(x)`` alone 30 bytes.
DISTINCTIVE = 40
_GRADING_DIR = os.path.dirname(os.path.realpath(__file__))
_ACTIVE: Guard | None = None


class OffLimitsError(RuntimeError):
    """Raised in the student's code when it calls a function the exercise forbids."""


# ----------------------------------------------------------------------------- code identity

#: Instructions that say nothing about what a function does, or depend on where it was compiled.
_DROP = frozenset({"CACHE", "EXTENDED_ARG", "NOP", "RESUME", "PRECALL", "PUSH_NULL", "MAKE_CELL",
                   "COPY_FREE_VARS"})
#: Variable access by kind: a local's name is replaced by its position (arguments) or its order
#: of first use; a global's (or a free variable's) name is kept, so ``np`` defined at module
#: level or in an enclosing function reads the same.
_LOCAL_OPS = {"LOAD_FAST": "LOAD", "LOAD_FAST_CHECK": "LOAD", "LOAD_FAST_AND_CLEAR": "LOAD",
              "LOAD_DEREF": "LOAD", "LOAD_CLASSDEREF": "LOAD", "LOAD_FROM_DICT_OR_DEREF": "LOAD",
              "STORE_FAST": "STORE", "STORE_DEREF": "STORE", "DELETE_FAST": "DELETE",
              "DELETE_DEREF": "DELETE", "LOAD_FAST_LOAD_FAST": "LOAD",
              "STORE_FAST_STORE_FAST": "STORE", "STORE_FAST_LOAD_FAST": "STORE_LOAD"}
_GLOBAL_OPS = {"LOAD_GLOBAL": "LOAD", "LOAD_NAME": "LOAD", "LOAD_FROM_DICT_OR_GLOBALS": "LOAD",
               "STORE_GLOBAL": "STORE", "STORE_NAME": "STORE", "DELETE_GLOBAL": "DELETE",
               "DELETE_NAME": "DELETE"}
#: ``np.f(x)`` compiles to LOAD_ATTR when the same code unit imports ``np``, else to LOAD_METHOD.
_RENAMED = {"LOAD_METHOD": "LOAD_ATTR"}
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
#: co_flags that change what a function is (varargs, generators, coroutines), not how it was
#: compiled (nested, ``from __future__ import annotations``).
_FLAGS = 0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200
_IDENTITY: dict[int, tuple[Any, str, int]] = {}  # id(code) -> (weakref to it, fingerprint, size)


def _norm_const(value: Any) -> str:
    if isinstance(value, types.CodeType):
        return "code:" + fingerprint(value)
    if isinstance(value, (str, bytes)):
        return "s"  # docstrings and messages may be edited in a copy
    if isinstance(value, (tuple, frozenset)):
        parts = [_norm_const(v) for v in value]
        return "(" + ",".join(sorted(parts) if isinstance(value, frozenset) else parts) + ")"
    return f"{type(value).__name__}:{value!r}"


def _normalise(code: types.CodeType, outer: dict[str, str] | None = None) -> tuple[str, int]:
    """(fingerprint, number of instructions) of a code object's normalised instruction stream.

    ``outer`` names the enclosing function's tokens for this code's free variables (when it is
    hashed as a constant of that function), so a closure over a renamed local still matches.
    """
    nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(
        code.co_flags & 0x08)
    tokens = {name: f"A{i}" for i, name in enumerate(code.co_varnames[:nargs])}
    free = set(code.co_freevars)
    n_locals = 0

    def token(name: str) -> str:
        nonlocal n_locals
        if name not in tokens:
            if name in free:
                tokens[name] = (outer or {}).get(name) or f"G:{name}"
            else:
                tokens[name] = f"L{n_locals}"
                n_locals += 1
        return tokens[name]

    instructions = list(dis.get_instructions(code))
    index, kept = {}, 0  # jump target offset -> index of the next kept instruction
    for ins in instructions:
        index[ins.offset] = kept
        kept += ins.opname not in _DROP
    parts = [f"{code.co_argcount},{code.co_posonlyargcount},{code.co_kwonlyargcount},"
             f"{code.co_flags & _FLAGS}"]
    for ins in instructions:
        op, arg = ins.opname, ins.argval
        if op in _DROP:
            continue
        if op in _LOCAL_OPS:
            names = arg if isinstance(arg, tuple) else (arg,)
            toks = [token(n) for n in names]
            scope = "G" if all(t.startswith("G:") for t in toks) else "L"
            text = f"{_LOCAL_OPS[op]}_{scope} {','.join(toks)}"
        elif op in _GLOBAL_OPS:
            text = f"{_GLOBAL_OPS[op]}_G G:{arg}"
        elif op == "LOAD_CLOSURE":  # emitted in alphabetical order of the captured names
            text = op
        elif op == "KW_NAMES":
            text = f"{op} {arg!r}"
        elif isinstance(arg, types.CodeType):
            inner = {n: token(n) if n in tokens or n in free else "F" for n in arg.co_freevars}
            text = f"{op} code:{_normalise(arg, inner)[0]}"
        elif ins.opcode in dis.hasconst:
            text = f"{op} {_norm_const(arg)}"
        elif ins.opcode in _JUMPS:
            text = f"{op} ->{index.get(arg, arg)}"
        else:
            text = f"{_RENAMED.get(op, op)} {arg!r}" if ins.arg is not None else op
        parts.append(text)
    digest = hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()
    return digest, kept


def _identity(code: types.CodeType) -> tuple[str, int]:
    """``(fingerprint(code), its instruction count)``, computed once per code object."""
    known = _IDENTITY.get(id(code))
    if known is not None and known[0]() is code:
        return known[1], known[2]
    fp, size = _normalise(code)
    key = id(code)
    _IDENTITY[key] = (weakref.ref(code, lambda _, key=key: _IDENTITY.pop(key, None)), fp, size)
    return fp, size


_PATHS = sysconfig.get_paths()
#: No answer cell writes code here: the installed Python and packages, and the grading package.
_NOT_STUDENT_DIRS = tuple(sorted({os.path.realpath(_PATHS[k]) + os.sep for k in (
    "stdlib", "platstdlib", "purelib", "platlib")} | {_GRADING_DIR + os.sep}))
_NOT_STUDENT_CODE: dict[str, bool] = {}  # filename -> whether it is in _NOT_STUDENT_DIRS


def _may_be_a_copy(code: types.CodeType) -> bool:
    """Whether ``code`` is worth fingerprinting: big enough, and not from ``_NOT_STUDENT_DIRS``."""
    if len(code.co_code) < 2 * DISTINCTIVE:  # every instruction is at least 2 bytes
        return False
    name = code.co_filename
    skip = _NOT_STUDENT_CODE.get(name)
    if skip is None:
        skip = not _synthetic(name) and os.path.realpath(name).startswith(_NOT_STUDENT_DIRS)
        _NOT_STUDENT_CODE[name] = skip
    return not skip


def fingerprint(code: types.CodeType) -> str:
    """A hash of a code object's normalised instruction stream (nested code included): the same
    for a copy compiled from pasted source with renamed locals, edited docstrings and messages,
    with or without the module's imports, at module level or inside a function.

    Global and attribute names, numbers and the control flow are kept; local names, string
    constants, inline caches and call-protocol details (LOAD_METHOD vs LOAD_ATTR, PRECALL,
    PUSH_NULL) are not.
    """
    return _identity(code)[0]


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _where(code: types.CodeType) -> tuple[str, int, str]:
    name = code.co_filename
    path = name if name.startswith("<") else os.path.realpath(name)
    return (path, code.co_firstlineno, _qualname(code))


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    """A code object and every code object nested in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _synthetic(filename: str) -> bool:
    """Code compiled from a string (``exec``, dataclasses, namedtuples): its file, line and name
    say nothing about what it is."""
    return filename.startswith("<")


def _entry(code: types.CodeType, label: str) -> dict:
    """One forbidden function as plain data; ``label`` is how refusals name it.

    ``distinctive``: big enough to be matched by fingerprint alone (a pasted copy).
    """
    path, line, qualname = _where(code)
    fp, size = _identity(code)
    return {"label": label, "file": path, "line": line, "qualname": qualname, "size": size,
            "fp": fp, "distinctive": size >= DISTINCTIVE}


# ----------------------------------------------------------------------------- the plan


#: Where wrapper objects keep the function they wrap, in the order tried: methods and
#: static/class methods, Numba dispatchers, numpy's array-function dispatchers,
#: ``functools.wraps``, ``functools.partial``, ``@graph_pass`` objects and the CUDA simulator's
#: kernels.
_WRAPPED = ("__func__", "py_func", "_implementation", "__wrapped__", "func", "fn")
_PLAIN = (type, types.ModuleType, types.BuiltinFunctionType, types.MethodDescriptorType,
          types.WrapperDescriptorType, property)


def _unwrap(obj: Any) -> Any:
    """The plain function (or class / C function / property) behind a wrapper object.

    A Python function is unwrapped only through ``__wrapped__`` (``functools.wraps``); any other
    callable object through the first of ``_WRAPPED`` that holds a callable.
    """
    for _ in range(8):
        if isinstance(obj, _PLAIN):
            break
        names = ("__wrapped__",) if isinstance(obj, types.FunctionType) else _WRAPPED
        for name in names:
            try:
                inner = getattr(obj, name, None)
            except Exception:  # a property of the wrapper that fails
                inner = None
            if inner is not None and inner is not obj and callable(inner):
                obj = inner
                break
        else:
            break
    return obj


def _targets(obj: Any, label: str) -> tuple[list[dict], list[dict]]:
    """(code entries, C-function entries) for one resolved spec."""
    obj = _unwrap(obj)
    if isinstance(obj, property):
        parts = [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
        return [_entry(f.__code__, f"`{label}`") for f in parts], []
    if isinstance(obj, types.FunctionType):
        return [_entry(obj.__code__, f"`{label}`")], []
    if isinstance(obj, type):
        code, builtin = [], []
        for name, member in vars(obj).items():
            inner = _unwrap(member)
            if isinstance(inner, type) and not inner.__qualname__.startswith(obj.__qualname__):
                continue
            if isinstance(inner, (types.FunctionType, property, type)):
                c, b = _targets(member, f"{label}.{name}")
                code, builtin = code + c, builtin + b
        return code, builtin
    if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType,
                        types.WrapperDescriptorType)):
        self = getattr(obj, "__self__", None)
        owner_cls = getattr(obj, "__objclass__", self if isinstance(self, type) else None)
        if owner_cls is not None:  # a method, or a classmethod (``dict.fromkeys``)
            owner = f"{owner_cls.__module__}.{owner_cls.__qualname__}"
        else:
            owner = self.__name__ if isinstance(self, types.ModuleType) else obj.__module__
        return [], [{"label": f"`{label}`", "name": obj.__name__, "owner": owner}]
    raise ValueError(
        f"cannot guard {label}: a {type(obj).__name__} is neither a Python function, a class, a "
        f"wrapper of one (a Numba dispatcher, a Pass) nor a C function; check the idea instead "
        f"of forbidding it"
    )


def _resolve(spec: str) -> tuple[list[dict], list[dict]]:
    module_name, _, path = spec.partition(":")
    module = importlib.import_module(module_name)
    if not path:  # a whole module: every function compiled from its source
        filename = inspect.getsourcefile(module)
        with open(filename, encoding="utf-8") as f:
            top = compile(f.read(), filename, "exec")
        codes = [c for c in _codes(top) if c is not top]
        return [_entry(c, f"`{module_name}.{_qualname(c)}`") for c in codes], []
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return _targets(obj, f"{module_name}.{path}")


def _grading_file(filename: str) -> bool:
    return not filename.startswith("<") and os.path.realpath(filename).startswith(_GRADING_DIR)


def _reachable(roots: Iterable[Any]) -> set[tuple]:
    """Where-keys of every grading-package function the roots can reach (what a probe uses)."""
    keys: set[tuple] = set()
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
            continue
        if isinstance(obj, type):
            if obj.__module__.startswith("mlsys_lab.grading"):
                todo.extend(vars(obj).values())
            continue
        fn = _unwrap(obj)
        if isinstance(fn, property):
            todo.extend(f for f in (fn.fget, fn.fset, fn.fdel) if f is not None)
            continue
        if not isinstance(fn, types.FunctionType) or not _grading_file(fn.__code__.co_filename):
            continue
        names: set[str] = set()
        for code in _codes(fn.__code__):
            keys.add(_where(code))
            names.update(code.co_names)
        scope = fn.__globals__
        modules = [v for v in scope.values() if isinstance(v, types.ModuleType)
                   and v.__name__.startswith("mlsys_lab.grading")]
        for name in names:
            if name in scope:
                todo.append(scope[name])
            todo.extend(getattr(m, name) for m in modules if hasattr(m, name))
        todo.extend(cell.cell_contents for cell in fn.__closure__ or () if _filled(cell))
        todo.extend(fn.__defaults__ or ())
        todo.extend((fn.__kwdefaults__ or {}).values())
    return keys


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not cell
    except ValueError:  # an empty cell
        return False


_REFERENCE_CODES: dict[str, list[types.CodeType]] = {}


def _reference_codes() -> list[types.CodeType]:
    """Every function compiled from the chapter check modules, ``mlsys_lab/grading/chNN.py``."""
    out = []
    for filename in sorted(glob.glob(os.path.join(_GRADING_DIR, "ch[0-9]*.py"))):
        if filename not in _REFERENCE_CODES:
            with open(filename, encoding="utf-8") as f:
                top = compile(f.read(), filename, "exec")
            _REFERENCE_CODES[filename] = [c for c in _codes(top) if c is not top]
        out.extend(_REFERENCE_CODES[filename])
    return out


def task_of(exercise) -> str:
    """How refusals name what the exercise asks for: its ``task``, else its target names."""
    return exercise.task or " and ".join(f"`{t}`" for t in exercise.targets)


_PLANS: dict[int, tuple[Any, dict]] = {}


def plan_for(exercise) -> dict:
    """The guard plan of an exercise, as plain data (what the grader sends to the kernel).

    Raises:
        ValueError: a ``forbidden`` spec names something that cannot be guarded (a ufunc).
        ImportError, AttributeError: a spec names a module or attribute that does not exist.
    """
    cached = _PLANS.get(id(exercise))
    if cached is not None and cached[0] is exercise:
        return cached[1]
    plan = _make_plan(exercise)
    _PLANS[id(exercise)] = (exercise, plan)
    return plan


def _make_plan(exercise) -> dict:
    code, builtin = [], []
    for spec in exercise.forbidden:
        c, b = _resolve(spec)
        code, builtin = code + c, builtin + b
    probes = [case.probe for case in exercise.cases if case.probe is not None]
    used = _reachable(probes)
    used_fps = set()
    for ref in _reference_codes():
        if _where(ref) in used:
            used_fps.add(fingerprint(ref))
            continue
        module = os.path.splitext(os.path.basename(ref.co_filename))[0]
        label = f"`mlsys_lab.grading.{module}.{_qualname(ref)}` (the grader's own reference)"
        code.append(_entry(ref, label))
    for entry in code:  # a probe helper with the same bytecode must not be refused
        if entry["fp"] in used_fps:
            entry["distinctive"] = False
    return {"task": task_of(exercise), "code": code, "builtins": builtin}


# ----------------------------------------------------------------------------- enforcing it


class unguarded:
    """``with unguarded():`` lets a probe call forbidden functions itself (to build inputs).

    Only code in the grading package may use it; from the student's code it is a violation.
    It lifts the guard for the probe's own thread only.
    """

    def __enter__(self):
        guard = _ACTIVE
        self.guard = guard
        if guard is None:
            return self
        if not _grading_file(sys._getframe(1).f_code.co_filename):
            guard._violation("your code used the grader's unguarded(); the check cannot trust it")
        guard._lifted += 1
        return self

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard._lifted -= 1
        return False


def _watched_builtins() -> dict[int, tuple[Any, str]]:
    found = {}
    for name in ("setprofile", "settrace", "getprofile", "gettrace", "_setprofileallthreads",
                 "_settraceallthreads"):
        if hasattr(sys, name):
            found[id(getattr(sys, name))] = (getattr(sys, name), f"sys.{name}")
    monitoring = getattr(sys, "monitoring", None)
    for name in dir(monitoring) if monitoring is not None else ():
        member = getattr(monitoring, name)
        if isinstance(member, types.BuiltinFunctionType):
            found[id(member)] = (member, f"sys.monitoring.{name}")
    return found


def _watched_python() -> dict[int, tuple[Any, str]]:
    found = {}
    for name in ("setprofile", "settrace", "getprofile", "gettrace", "setprofile_all_threads",
                 "settrace_all_threads"):
        fn = getattr(threading, name, None)
        if isinstance(fn, types.FunctionType):
            found[id(fn.__code__)] = (fn.__code__, f"threading.{name}")
    return found


_FORBIDDEN, _TAMPER, _DISPATCH = 1, 2, 3


class Guard:
    """Enforces one exercise's plan around each probe (see the module docstring).

    Example:
        >>> guard = Guard(plan_for(exercise))          # doctest: +SKIP
        >>> with guard.watching():                      # doctest: +SKIP
        ...     value = probe(answer)
        >>> guard.violations                            # doctest: +SKIP
        []
    """

    def __init__(self, plan: dict):
        self.task = plan.get("task", "this")
        self._by_where: dict[tuple, str] = {}
        self._by_synthetic: dict[tuple, dict[str, str]] = {}  # where -> {fingerprint: label}
        self._by_fp: dict[str, str] = {}
        for e in plan["code"]:
            where = (e["file"], e["line"], e["qualname"])
            if _synthetic(e["file"]):  # every dataclass's __init__ comes from ("<string>", 2, ...)
                self._by_synthetic.setdefault(where, {})[e["fp"]] = e["label"]
            else:
                self._by_where[where] = e["label"]
            if e["distinctive"]:
                self._by_fp.setdefault(e["fp"], e["label"])
        self._c_funcs: dict[str, dict[str, str]] = {}
        for e in plan.get("builtins", ()):
            self._c_funcs.setdefault(e["name"], {})[e["owner"]] = e["label"]
        self._watched_c = _watched_builtins()
        self._watched_py = _watched_python()
        self.violations: list[str] = []
        self._seen: dict[int, tuple] = {}
        self._lifted = 0
        self._closing = True
        self._thread = threading.get_ident()
        self._dispatchers: dict[int, tuple[Any, tuple[str, str]]] = {}
        self._entry_points: dict[int, tuple[Any, tuple[str, str]]] = {}
        self._dispatch_codes: dict[int, types.CodeType] = {}
        self._found: list | None = None
        self.hook = self._hook  # one bound-method object, so ``sys.getprofile() is`` works

    # -- matching -------------------------------------------------------------------------

    def _label(self, code: types.CodeType) -> tuple[str, str] | None:
        """(label, note) when ``code`` is forbidden: its origin matches, or it is a copy."""
        where = _where(code)
        label = self._by_where.get(where)
        if label is None and where in self._by_synthetic:
            label = self._by_synthetic[where].get(fingerprint(code))
        if label is not None:
            return label, ""
        if self._by_fp and _may_be_a_copy(code):
            fp, size = _identity(code)
            label = self._by_fp.get(fp) if size >= DISTINCTIVE else None
            if label is not None:
                name = where[2].rpartition("<locals>.")[2]
                return label, f" (your `{name}` is a copy of its code)"
        return None

    def _classify(self, code: types.CodeType) -> tuple:
        label = self._label(code)
        if label is not None:
            entry = (code, _FORBIDDEN, label)
        elif id(code) in self._watched_py:
            entry = (code, _TAMPER, self._watched_py[id(code)][1])
        elif self._dispatch_codes.get(id(code)) is code:
            entry = (code, _DISPATCH, None)
        else:
            entry = (code, None, None)
        self._seen[id(code)] = entry  # holds the code object, so its id is never reused
        return entry

    def _violation(self, message: str) -> None:
        """Record a violation (it sticks) and stop the student's code here."""
        if message not in self.violations:
            self.violations.append(message)
        raise OffLimitsError(message)

    def _refuse(self, label: tuple[str, str] | str, tamper: bool = False) -> None:
        if tamper:
            self._violation(f"your code called `{label}`, which switches off the check's watch "
                            f"for off-limits functions; the check cannot trust this result")
        label, note = label
        self._violation(f"this exercise asks you to write {self.task} yourself; {label} is off "
                        f"limits here{note}")

    def _hook(self, frame, event, arg):
        if self._closing:
            return
        if event == "call":
            code = frame.f_code
            entry = self._seen.get(id(code))
            if entry is None or entry[0] is not code:
                entry = self._classify(code)
            kind = entry[1]
            if kind is None:
                return
            if kind == _DISPATCH:
                label = self._dispatcher_label(frame.f_locals.get("self"))
                if label is None:
                    return
            else:
                label = entry[2]
            if kind != _TAMPER and self._lifted and threading.get_ident() == self._thread:
                return
            self._refuse(label, tamper=kind == _TAMPER)
        elif event == "c_call":
            if id(arg) in self._watched_c and self._watched_c[id(arg)][0] is arg:
                self._refuse(self._watched_c[id(arg)][1], tamper=True)
            if id(arg) in self._entry_points and self._entry_points[id(arg)][0] is arg:
                label = self._entry_points[id(arg)][1]
            else:
                owners = self._c_funcs.get(getattr(arg, "__name__", None))
                if owners is None:
                    return
                label = _c_label(arg, owners)
                if label is None:
                    return
                label = (label, "")
            if self._lifted and threading.get_ident() == self._thread:
                return
            self._refuse(label)

    # -- Numba ----------------------------------------------------------------------------

    def _dispatcher_label(self, dispatcher) -> tuple[str, str] | None:
        if dispatcher is None:
            return None
        known = self._dispatchers.get(id(dispatcher))
        if known is not None and known[0] is dispatcher:
            return known[1]
        codes = [getattr(getattr(dispatcher, "py_func", None), "__code__", None)]
        # What the overloads were compiled from: a swapped ``py_func`` does not change them.
        overloads = getattr(dispatcher, "overloads", None)
        for cres in list(overloads.values()) if isinstance(overloads, dict) else ():
            func_id = getattr(getattr(cres, "type_annotation", None), "func_id", None)
            codes.append(getattr(func_id, "code", None))
        for code in codes:
            if isinstance(code, types.CodeType):
                entry = self._seen.get(id(code))
                if entry is None or entry[0] is not code:
                    entry = self._classify(code)
                if entry[1] == _FORBIDDEN:
                    return entry[2]
        return None

    def _switch_off_dispatchers(self) -> None:
        """Find every compiled dispatcher that runs forbidden code and switch its entries off."""
        mod = sys.modules.get("numba.core.dispatcher")
        if mod is None or not (self._by_where or self._by_synthetic or self._by_fp):
            return
        for cls in mod.Dispatcher.__mro__ + _cuda_dispatcher_classes():
            if cls.__module__.startswith("numba"):
                for member in vars(cls).values():
                    fn = _unwrap(member)
                    if isinstance(fn, types.FunctionType):
                        self._dispatch_codes[id(fn.__code__)] = fn.__code__
        if self._found is None:  # once per guard: later copies are caught when they compile
            self._found = [o for o in gc.get_objects() if isinstance(o, mod._DispatcherBase)]
        off: dict[int, tuple[Any, tuple[str, str]]] = {}
        for d in self._found:
            label = self._dispatcher_label(d)
            if label is not None:
                off[id(d)] = (d, label)
        nbtypes = sys.modules["numba.core.types"]
        changed = True
        while changed:  # dispatchers whose compiled code calls a switched-off one
            changed = False
            for d in self._found:
                if id(d) in off or not isinstance(d, mod.Dispatcher):
                    continue
                for cres in list(d.overloads.values()):
                    typemap = getattr(getattr(cres, "fndesc", None), "typemap", None) or {}
                    callees = [t.dispatcher for t in typemap.values()
                               if isinstance(t, nbtypes.Dispatcher) and id(t.dispatcher) in off]
                    if callees:
                        name = getattr(d.py_func, "__qualname__", "?")
                        label, note = off[id(callees[0])][1]
                        off[id(d)] = (d, (f"{label}, called from the compiled `{name}`,", note))
                        changed = True
                        break
        self._dispatchers = off
        for d, label in off.values():
            if isinstance(d, mod.Dispatcher):
                for cres in d.overloads.values():
                    self._entry_points[id(cres.entry_point)] = (cres.entry_point, label)
                d._clear()  # calls now fall back into the dispatcher's Python methods

    def _restore_dispatchers(self) -> None:
        mod = sys.modules.get("numba.core.dispatcher")
        for d, _ in self._dispatchers.values():
            if mod is not None and isinstance(d, mod.Dispatcher):
                d._clear()
                for cres in list(d.overloads.values()):
                    d.add_overload(cres)
        self._dispatchers = {}

    # -- the probe's window ---------------------------------------------------------------

    def watching(self) -> _Window:
        """A context manager: the guard is on inside it; ``self.violations`` says what happened."""
        return _Window(self)

    def _start(self) -> None:
        global _ACTIVE
        self.violations = []
        self._lifted = 0
        self._thread = threading.get_ident()
        self._seen = {}
        self._dispatch_codes = {}
        self._entry_points = {}
        self._switch_off_dispatchers()
        self._previous = (sys.getprofile(), getattr(threading, "_profile_hook", None))
        _ACTIVE = self
        if hasattr(threading, "setprofile_all_threads"):  # Python 3.12+: running threads too
            threading.setprofile_all_threads(self.hook)
        else:
            threading.setprofile(self.hook)
            sys.setprofile(self.hook)
        self._closing = False

    def _stop(self) -> None:
        global _ACTIVE
        self._closing = True
        current = sys.getprofile()
        new_threads = getattr(threading, "_profile_hook", None)
        if not self.violations and (current is not self.hook or new_threads is not self.hook):
            self.violations.append(
                "your code switched off the check's watch for off-limits functions (the profile "
                "hook was removed or replaced); the check cannot trust this result"
            )
        previous, previous_threads = self._previous
        if hasattr(threading, "setprofile_all_threads"):
            threading.setprofile_all_threads(previous)
        sys.setprofile(previous)
        threading.setprofile(previous_threads)
        self._restore_dispatchers()
        _ACTIVE = None


def _cuda_dispatcher_classes() -> tuple[type, ...]:
    cuda = sys.modules.get("numba.cuda.dispatcher")
    cls = getattr(cuda, "CUDADispatcher", None)
    return cls.__mro__ if isinstance(cls, type) else ()


def _c_label(builtin, owners: dict[str, str]) -> str | None:
    """The label of a C function Python code is calling, if the plan forbids it.

    ``owners`` maps owners (a module, ``numpy.ndarray``) to labels for the function's name. A
    method matches when any class in its object's MRO is an owner that defines this very
    method, so ``numpy:generic.view`` covers ``np.uint16(x).view`` and ``numpy:ndarray.mean`` an
    ndarray subclass's ``mean``.
    """
    self = getattr(builtin, "__self__", None)
    if isinstance(self, types.ModuleType):
        return owners.get(self.__name__)
    if self is None:
        return owners.get(getattr(builtin, "__module__", None) or "")
    bound_to_class = isinstance(self, type)  # a classmethod: ``dict.fromkeys``
    for cls in self.__mro__ if bound_to_class else type(self).__mro__:
        label = owners.get(f"{cls.__module__}.{cls.__qualname__}")
        if label is None:
            continue
        method = vars(cls).get(builtin.__name__)
        try:  # the same C function bound to the same object compares equal
            if bound_to_class:
                same = method.__get__(None, self) == builtin
            else:
                same = method.__get__(self, type(self)) == builtin
        except Exception:  # not a descriptor we can rebind: trust the name
            same = True
        if same:
            return label
    return None


class _Window:
    def __init__(self, guard: Guard):
        self.guard = guard

    def __enter__(self) -> Guard:
        try:
            self.guard._start()
        except BaseException:  # never leave a library dispatcher switched off
            self.guard._restore_dispatchers()
            raise
        return self.guard

    def __exit__(self, *exc) -> bool:
        self.guard._stop()
        return False
