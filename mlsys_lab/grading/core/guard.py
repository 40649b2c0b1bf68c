"""The forbidden-functions guard: while a probe runs the student's code, shortcuts refuse to run.

Each ``Exercise`` names the library functions that would solve it (``forbidden=(...)``, specs
like ``"mlsys_lab.engine.schedule:kahn"``; a wrapper such as a ``@graph_pass`` object, a
``functools.partial`` or a Numba dispatcher stands for the function it wraps), and the grader's
own reference answers — every function in the chapter check modules
(``mlsys_lab/grading/chNN.py``) that the exercise's probes do not use — are added automatically.
``plan_for(exercise)`` turns that into plain data (where each forbidden function's code was
defined, and a fingerprint of its code); the grader computes it in its own process and sends it
to the kernel, ``check()`` computes it in place. The references, the same ~1,300 entries for
every exercise (``reference_plan()``), travel once per kernel, into the seal
(``seal_references``); a plan names them by digest, with those its probes call.

``seal()`` runs first in every kernel the grader starts, before any student cell: it records the
code objects the loaded modules hold (what is *not* the student's; installed code loaded later
is recognised as it is on disk), the threads already running, and the functions and classes the
checks rely on (see "The seal" below). The forbidden functions' code and n-grams are compiled
from their files when a probe first needs them.

``Guard(plan, state)`` enforces the plan in the kernel. While a probe runs
(``with guard.watching():``):

* a profile hook (``sys.setprofile``, and ``threading.setprofile`` for threads started meanwhile)
  looks at every function that starts (where ``native_hook`` builds, a native function answers
  the events that need nothing, such as returns and calls of code already found harmless, and
  hands the rest to the Python hook). Code is matched by *where it was defined* (file, first
  line, qualified name) — so saved references, bound methods, ``f = kahn`` and
  ``types.FunctionType(kahn.__code__, ...)`` are all caught. Code the seal does not know (and
  that is not the grading package's own, as on disk) is the student's, *whatever file name it
  claims* (``code.replace(co_filename=...)``, a library module compiled under another name): it
  is refused when it is a clone of a forbidden function (the same normalised stream under the
  same name, or the very same bytes and constants, at least ``CLONE`` instructions), or when
  it is a copy of a big one (``DISTINCTIVE`` instructions): the Jaccard similarity of their
  instruction n-grams (``shingles``; locals, strings and jump targets abstracted, padding
  ignored) is at least ``SIMILAR`` (compared in full only with forbidden functions of about its
  size whose ``sketch``, which the plan carries, allows it: ``may_be_similar`` is an exact
  bound). A match raises ``OffLimitsError`` and records the refusal;
  a refusal sticks, so catching the error does not help.
* The closed probe (the plan's ``allowed``, from ``Exercise.allowed``): a function of a module
  the allowlist does not permit (longest matching entry; ``-numpy.f2py`` takes one back out) is
  refused when the student's code called it — directly, from C (``map``, ``partial``), or
  through standard-library frames (a callback: ``heapq.merge(key=f)``; a ``threading.Thread``
  the student's code started, whose target it is). The module of a function is the one its
  file is loaded as; the student's own code (``_origin``: neither known to the seal nor
  installed code as it is on disk) may claim any file and is always permitted. A permitted
  package calling others inside itself is not refused, nor is the standard library using its
  own modules, nor module code run by an import (importing is not running), nor ``__del__``,
  nor a ``gc.callbacks`` function (the collector calls it, whatever frame was running).
  C functions the student's code calls are judged by the module of the function (or of the
  class defining the method). The import machinery, the kernel's output path (``print``) and
  tqdm are always allowed.
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
* Threads: before Python 3.12 a profile hook cannot be given to a thread that is already
  running, so a thread the notebook's cells started (not the kernel's, nor tqdm's monitor) that
  is still running when a probe starts fails the case. A thread started *during* a probe gets
  the hook and keeps it: later it answers to whichever guard is on (the seal's ``active``), so a
  worker left over from one check is watched in the next. A thread started with ``_thread``
  directly (which ``threading.setprofile`` does not reach) is refused.

The seal. ``tampered(state)`` lists what changed since ``seal()`` among the functions, methods,
classes and modules of ``SEALED_MODULES`` (the simulator, the pipeline-parallel helpers, every
other non-grading ``mlsys_lab`` module, ``json``, ``threading``, numpy, builtins, the kernel's
display publisher and session): a replaced attribute or ``sys.modules`` entry, a swapped
``__code__`` or ``__defaults__`` (classes whose namespace Python itself keeps from changing,
static and immutable types such as ``numpy.ndarray``, are not recorded). A module of
``SEALED_MODULES`` first imported after the seal (by the notebook, or by a probe as it runs) is
recorded the first time ``tampered`` sees it, if everything it holds is the library's code
(``_seal_late``); a member that is the notebook's is named instead. The hidden cell looks
before and after the probes and fails every case when anything changed; it decodes the plan
with the JSON decoder the seal holds, and sends the payload with its JSON encoder and
publisher, not the kernel's current ones.

The guard is a tripwire for every shortcut a notebook offers, not a sandbox: code that walks the
interpreter's frames or objects to find and rewrite the guard's or the seal's state is deliberate
reverse engineering and out of scope.
"""

from __future__ import annotations

import bisect
import dis
import functools
import gc
import glob
import hashlib
import importlib
import inspect
import json
import operator
import os
import sys
import threading
import types
import weakref
import zlib
from typing import Any, Iterable, Sequence

import numpy as np

from mlsys_lab.grading.core import native_hook
from mlsys_lab.grading.core.wire import OffLimitsError

__all__ = ["Guard", "OffLimitsError", "fingerprint", "plan_entries", "plan_for", "plan_text",
           "reference_plan", "unguarded"]

#: Functions with at least this many instructions (normalised, see ``fingerprint``) are also
#: matched by fingerprint, as a pasted copy; smaller ones (``return x * x``, a one-line numpy
#: formula) look like honest answers, so only their origin counts. Counted in instructions, not
#: bytes: Python 3.11's inline caches make ``np.f(x)`` alone 30 bytes.
DISTINCTIVE = 40
_GRADING_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_ACTIVE: Guard | None = None


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

    instructions = _instructions(code)
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


_DECODED: list = [None, None]  # the last code object decoded (a weak reference) and its list


def _instructions(code: types.CodeType) -> list:
    """``dis.get_instructions(code)`` as a list, kept for the last code object decoded: its
    fingerprint and its n-grams are usually computed one after the other (``Guard._label``),
    and decoding is most of the cost of either."""
    last = _DECODED[0]
    if last is not None and last() is code:
        return _DECODED[1]
    instructions = list(dis.get_instructions(code))
    _DECODED[:] = [weakref.ref(code), instructions]
    return instructions


def _identity(code: types.CodeType) -> tuple[str, int]:
    """``(fingerprint(code), its instruction count)``, computed once per code object."""
    known = _IDENTITY.get(id(code))
    if known is not None and known[0]() is code:
        return known[1], known[2]
    fp, size = _normalise(code)
    key = id(code)
    _IDENTITY[key] = (weakref.ref(code, lambda _, key=key, table=_IDENTITY: table.pop(key, None)),
                      fp, size)
    return fp, size


#: Untrusted code at least this big (normalised instructions) whose instruction stream equals a
#: forbidden function's, under the same qualified name, is that function cloned
#: (``code.replace(co_filename=...)``), whatever its size.
CLONE = 12
#: Jaccard similarity of instruction n-grams at or above which student code is a copy of a
#: forbidden function (both at least ``DISTINCTIVE`` instructions). Independent answers to the
#: chapters' exercises score at most about 0.45 against the references (see the tests); a paste
#: with a few lines added, removed or renamed scores 0.8 and more.
SIMILAR = 0.85
_NGRAMS = (3, 4, 5)
_PURE_LOADS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"})
_GRAMS: dict[int, tuple[Any, frozenset, tuple[int, ...]]] = {}  # id(code) -> (weakref to it,
#                                                         its n-grams, their sketch)
#: Buckets of an n-gram ``sketch``.
SKETCH_BUCKETS = 16
_CODE_OF_FP: dict[str, types.CodeType] = {}  # forbidden code seen by ``_entry``, by fingerprint


#: Python 3.13's superinstructions: two local variable accesses in one instruction.
_FUSED = {"LOAD_FAST_LOAD_FAST": ("LOAD_FAST", "LOAD_FAST"),
          "STORE_FAST_STORE_FAST": ("STORE_FAST", "STORE_FAST"),
          "STORE_FAST_LOAD_FAST": ("STORE_FAST", "LOAD_FAST")}


def _unfused(instructions: list) -> list:
    """Each superinstruction as the two instructions it stands for: a padding store fused with
    the next line's load (``_c = None`` then ``x``: STORE_FAST_LOAD_FAST) is then seen as
    padding, and the stream reads as it does on 3.11 and 3.12."""
    if not any(ins.opname in _FUSED for ins in instructions):
        return instructions
    out = []
    for ins in instructions:
        parts = _FUSED.get(ins.opname)
        if parts is None or not isinstance(ins.argval, tuple):
            out.append(ins)
            continue
        out.extend(ins._replace(opname=op, opcode=dis.opmap[op], argval=name, argrepr=name)
                   for op, name in zip(parts, ins.argval))
    return out


def _tokens(code: types.CodeType) -> list[str]:
    """A code object's instruction stream for similarity: local names, string constants, jump
    targets and call-protocol details abstracted (so an added line shifts nothing), global and
    attribute names and numbers kept."""
    nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(
        code.co_flags & 0x08)
    args = {name: f"A{i}" for i, name in enumerate(code.co_varnames[:nargs])}
    instructions = _unfused([ins for ins in _instructions(code) if ins.opname not in _DROP])
    read = set(code.co_cellvars) | set(code.co_freevars)
    for ins in instructions:
        if ins.opname in _LOCAL_OPS and _LOCAL_OPS[ins.opname] != "STORE":
            read.update(ins.argval if isinstance(ins.argval, tuple) else (ins.argval,))
    out = []
    for k, ins in enumerate(instructions):
        op, arg = ins.opname, ins.argval
        nxt = instructions[k + 1] if k + 1 < len(instructions) else None
        # Padding does not count: a value loaded and dropped (``x``), or stored in a local
        # nothing reads (``_unused = None``).
        if nxt is not None and op in _PURE_LOADS and (
                nxt.opname == "POP_TOP" or (nxt.opname in ("STORE_FAST", "STORE_DEREF")
                                            and nxt.argval not in read)):
            continue
        if op in ("POP_TOP", "STORE_FAST", "STORE_DEREF") and k and (
                instructions[k - 1].opname in _PURE_LOADS) and (
                op == "POP_TOP" or arg not in read):
            continue
        if op in _LOCAL_OPS:
            names = arg if isinstance(arg, tuple) else (arg,)
            out.append(f"{_LOCAL_OPS[op]} " + ",".join(args.get(n, "L") for n in names))
        elif op in _GLOBAL_OPS:
            out.append(f"{_GLOBAL_OPS[op]}_G {arg}")
        elif isinstance(arg, types.CodeType):
            out.append(f"{op} code")
        elif ins.opcode in dis.hasconst:
            out.append(f"{op} {_norm_const(arg) if not isinstance(arg, tuple) else 'tuple'}")
        elif ins.opcode in _JUMPS:
            out.append(op)
        elif op in ("LOAD_CLOSURE", "PRECALL", "CALL", "KW_NAMES"):
            out.append(op)
        else:
            out.append(f"{_RENAMED.get(op, op)} {arg!r}" if ins.arg is not None else op)
    return out


def shingles(code: types.CodeType) -> frozenset:
    """The set of hashed instruction n-grams (n = 3, 4, 5 over ``_tokens``) of a code object,
    computed once per code object."""
    return _grams(code)[1]


def sketch(code: types.CodeType) -> tuple[int, ...]:
    """How many of a code object's distinct n-grams fall in each of ``SKETCH_BUCKETS`` buckets,
    by a hash of the n-gram that is the same in every process (``shingles`` hashes with
    Python's ``hash``, which is not): the plan carries each big forbidden function's, and
    ``may_be_similar`` bounds a pair's similarity with two of them."""
    return _grams(code)[2]


def _grams(code: types.CodeType) -> tuple[Any, frozenset, tuple[int, ...]]:
    known = _GRAMS.get(id(code))
    if known is not None and known[0]() is code:
        return known
    tokens = _tokens(code)
    distinct = {tuple(tokens[i:i + n]) for n in _NGRAMS for i in range(max(len(tokens) - n + 1, 0))}
    key = id(code)
    known = _GRAMS[key] = (
        weakref.ref(code, lambda _, key=key, table=_GRAMS: table.pop(key, None)),
        frozenset(map(hash, distinct)), _bucket_counts(distinct))
    return known


def _bucket_counts(grams: Iterable[tuple[str, ...]]) -> tuple[int, ...]:
    """A ``sketch`` of distinct n-grams (tuples of tokens)."""
    counts = [0] * SKETCH_BUCKETS
    for gram in grams:
        counts[zlib.crc32("\x1f".join(gram).encode()) % SKETCH_BUCKETS] += 1
    return tuple(counts)


def may_be_similar(a: Sequence[int], b: Sequence[int]) -> bool:
    """False when two code objects with these sketches cannot be copies of each other: two
    n-grams in common fall in the same bucket, so the pair has at most ``sum(min(a_k, b_k))``
    in common, and their Jaccard similarity is at most that over the union it implies. Exact:
    never False for a pair at or above ``SIMILAR``; it spares compiling and taking apart most
    forbidden functions of about a copy's size (70-100 of them for an answer of chapter 10)."""
    common = sum(map(min, a, b))
    return common >= SIMILAR * (sum(a) + sum(b) - common)


def similarity(a: types.CodeType, b: types.CodeType) -> float:
    """Jaccard similarity of two code objects' instruction n-grams (1.0: the same stream)."""
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y) if x or y else 1.0


def _exact_const(value: Any) -> tuple:
    if isinstance(value, frozenset):  # its order depends on the process's string hashes
        return ("frozenset", tuple(sorted(repr(v) for v in value)))
    return (type(value).__name__, repr(value))


def _exact(code: types.CodeType) -> tuple:
    """What a code object does, exactly: its bytes, constants and names (nested code included)."""
    consts = tuple(_exact(c) if isinstance(c, types.CodeType) else _exact_const(c)
                   for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars,
            code.co_cellvars, code.co_flags, code.co_argcount, code.co_kwonlyargcount)


# real path -> {(first line, qualified name): the code compiled there}
_ON_DISK: dict[str, dict[tuple[int, str], types.CodeType] | None] = {}


def _on_disk(filename: str) -> dict[tuple[int, str], types.CodeType] | None:
    """``{(first line, qualified name): code}`` of every code object compiled from a source
    file as it is on disk (once per file), or None when it is not a Python source file that
    compiles."""
    path = _REALPATH.get(filename) or os.path.realpath(filename)
    if path in _ON_DISK:
        return _ON_DISK[path]
    table = None
    if path.endswith(".py") and not filename.startswith("<"):
        top = _cached_code(path)
        if top is None:
            try:
                with open(path, "rb") as f:
                    top = compile(f.read(), path, "exec", dont_inherit=True)
            except (OSError, SyntaxError, ValueError):
                top = None
        if top is not None:
            table = {(c.co_firstlineno, _qualname(c)): c for c in (top, *_nested([top]).values())}
    _ON_DISK[path] = table
    return table


def _cached_code(path: str) -> types.CodeType | None:
    """The code in a source file's ``__pycache__`` entry when it is up to date with the file
    (its recorded modification time and size match, as the import system checks), else None:
    reading it is many times faster than compiling the source."""
    import importlib.util
    import marshal
    try:
        cached = importlib.util.cache_from_source(path)
        with open(cached, "rb") as f:
            data = f.read()
        stat = os.stat(path)
    except (OSError, NotImplementedError, ValueError):
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags != 0 or (int.from_bytes(data[8:12], "little") != int(stat.st_mtime) & 0xFFFFFFFF
                      or int.from_bytes(data[12:16], "little") != stat.st_size & 0xFFFFFFFF):
        return None  # a hash-based or stale entry: compile the source instead
    try:
        code = marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, types.CodeType) or os.path.realpath(code.co_filename) != path:
        return None
    return code


_ROOTS: list[tuple[str, ...]] = []


def _library_roots() -> tuple[str, ...]:
    """Where installed code lives: the standard library, site-packages and the mlsys_lab
    package (an editable install lives elsewhere)."""
    if not _ROOTS:
        import site
        import sysconfig
        paths = sysconfig.get_paths()
        roots = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
        try:
            roots += site.getsitepackages() + [site.getusersitepackages()]
        except AttributeError:  # a virtualenv's old site module
            pass
        roots.append(os.path.dirname(_GRADING_DIR))  # .../mlsys_lab
        _ROOTS.append(tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots
                                    if r})))
    return _ROOTS[0]


def _claims_installed(code: types.CodeType) -> bool:
    """Whether ``code`` says it comes from an installed file (the standard library,
    site-packages, mlsys_lab): notebook cells never do."""
    filename = code.co_filename
    return not filename.startswith("<") and os.path.realpath(filename).startswith(_library_roots())


def _as_on_disk(code: types.CodeType) -> bool:
    """Whether ``code`` is exactly what an installed source file (the standard library's,
    site-packages', mlsys_lab's), as it is on disk, compiles to at its place: the library's own
    code, loaded after the seal or a private copy, and not a clone or an edit claiming the
    file's name. A file the notebook wrote elsewhere (its folder, /tmp) is never the library's.
    """
    if code.co_filename.startswith("<"):
        return False
    if not _where(code)[0].startswith(_library_roots()):
        return False
    table = _on_disk(code.co_filename)
    known = table.get((code.co_firstlineno, _qualname(code))) if table else None
    # Code objects compare their instructions (unspecialised), constants, names, line table and
    # signature, never calling a constant's ``__eq__`` (other objects count by identity).
    return known is not None and (known is code or known == code)


def _code_at(where: tuple) -> types.CodeType | None:
    """The code object the file ``where[0]`` compiles to at ``where`` (a forbidden function's
    code, for its n-grams, when the kernel has not imported it)."""
    table = _on_disk(where[0]) if not _synthetic(where[0]) else None
    return table.get((where[1], where[2])) if table else None


def _grader_own(code: types.CodeType) -> bool:
    """Whether ``code`` is the grading package's own code, compiled from its files as they are
    on disk (the private copies the grader's hidden cell runs): same place, same bytes."""
    return _grading_file(code.co_filename) and _as_on_disk(code)


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


_REALPATH: dict[str, str] = {}


def _where(code: types.CodeType) -> tuple[str, int, str]:
    name = code.co_filename
    path = _REALPATH.get(name)
    if path is None:
        path = _REALPATH[name] = name if name.startswith("<") else os.path.realpath(name)
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

    ``distinctive``: big enough to be matched by fingerprint alone (a pasted copy); such an
    entry also has ``grams`` (how many distinct n-grams) and ``sketch`` (``sketch``).
    """
    path, line, qualname = _where(code)
    fp, size = _identity(code)
    _CODE_OF_FP.setdefault(fp, code)
    # How many n-grams it has, and their sketch: the kernel compares a copy's count and sketch
    # first, and computes the n-grams themselves only for the few functions both allow.
    entry = {"label": label, "file": path, "line": line, "qualname": qualname, "size": size,
             "fp": fp, "distinctive": size >= DISTINCTIVE, "grams": 0}
    if size >= DISTINCTIVE:
        entry.update(grams=len(shingles(code)), sketch=list(sketch(code)))
    return entry


def _entry_where(entry: dict) -> tuple[str, int, str]:
    """Where an entry's forbidden function was defined, as ``_where`` gives it."""
    return entry["file"], entry["line"], entry["qualname"]


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
    """Every function compiled from the exercise modules, ``mlsys_lab/grading/exercises/``,
    but finalisers (``__del__``): the interpreter runs one wherever its object dies (the
    collector freeing a probe's object in a cycle, inside a later exercise's probe), and a
    finaliser is never an answer."""
    out = []
    pattern = os.path.join(_GRADING_DIR, "exercises", "**", "*.py")
    for filename in sorted(glob.glob(pattern, recursive=True)):
        if filename not in _REFERENCE_CODES:
            with open(filename, encoding="utf-8") as f:
                top = compile(f.read(), filename, "exec")
            _REFERENCE_CODES[filename] = [c for c in _codes(top)
                                          if c is not top and c.co_name != "__del__"]
        out.extend(_REFERENCE_CODES[filename])
    return out


def _grading_module(filename: str) -> str:
    """``.../mlsys_lab/grading/exercises/ch02_x/ex2_1_y.py`` -> its dotted module name."""
    rel = os.path.relpath(os.path.splitext(os.path.realpath(filename))[0],
                          os.path.dirname(os.path.dirname(_GRADING_DIR)))
    return rel.replace(os.sep, ".").removesuffix(".__init__")


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
    references = reference_plan()
    # The grader's references the probes call are not forbidden ("excused"), and no code is
    # refused for being like theirs ("plain": a probe helper with the same bytecode).
    excused = [e for e in references["entries"] if _entry_where(e) in used]
    plain = sorted({e["fp"] for e in excused})
    for entry in code:
        if entry["fp"] in plain:
            entry["distinctive"] = False
    allowed = getattr(exercise, "allowed", None)
    return {"task": task_of(exercise), "code": code, "builtins": builtin,
            "references": {"digest": references["digest"], "plain": plain,
                           "excused": sorted({_entry_where(e) for e in excused})},
            "allowed": list(allowed) if allowed is not None else None}


def plan_text(exercise) -> str:
    """``plan_for(exercise)`` as the JSON text the grader sends to the kernel."""
    return json.dumps(plan_for(exercise), ensure_ascii=True, allow_nan=False)


def plan_entries(plan: dict) -> list[dict]:
    """Every forbidden-code entry of ``plan`` written out (what ``Guard`` indexes): its own,
    then the grader's references it names by digest, less those its probes call (``excused``)
    and with no fingerprint match where they are like those (``plain``).

    Raises:
        ValueError: the plan names references other than this process's ``reference_plan()``.
    """
    shared = plan.get("references")
    if shared is None:
        return list(plan["code"])
    references = reference_plan()
    if references["digest"] != shared["digest"]:
        raise ValueError("the plan names other reference answers than this process has")
    excused, plain = set(map(tuple, shared["excused"])), set(shared["plain"])
    return list(plan["code"]) + [
        {**e, "distinctive": e["distinctive"] and e["fp"] not in plain}
        for e in references["entries"] if _entry_where(e) not in excused]


_REFERENCE_PLAN: dict[str, Any] = {}


def reference_plan() -> dict:
    """The grader's own reference answers as forbidden entries, the part of every exercise's
    plan they all share: ``{"entries", "text" (their JSON), "digest" (its SHA-256)}``. The
    grader sends it once per kernel (``seal(..., references=text)``); a plan names it by
    digest."""
    codes = _reference_codes()
    key = tuple(map(id, codes))
    if _REFERENCE_PLAN.get("key") != key:
        entries = [_entry(ref, f"`{_grading_module(ref.co_filename)}.{_qualname(ref)}` "
                               "(the grader's own reference)") for ref in codes]
        text = json.dumps(entries, ensure_ascii=True, allow_nan=False)
        _REFERENCE_PLAN.update(key=key, codes=codes, entries=entries, text=text,
                               digest=hashlib.sha256(text.encode()).hexdigest())
    return {k: _REFERENCE_PLAN[k] for k in ("entries", "text", "digest")}


# ----------------------------------------------------------------------------- the seal

#: Modules whose functions and classes a probe, its judge's inputs or the result's way out rely
#: on: the seal records them before any student cell runs and ``tampered`` says what changed.
#: (``mlsys_lab.grading`` itself is not among them: the grader runs private copies of it.)
SEALED_MODULES = ("mlsys_lab", "json", "threading", "_thread", "queue", "numpy", "builtins",
                  "sys", "base64", "io", "math", "reprlib", "dataclasses", "functools",
                  "itertools", "os", "posix", "struct", "_struct", "time",  # 9.1's call pipe
                  "concurrent", "IPython.display", "IPython.core.display_functions",
                  "IPython.core.displaypub", "ipykernel.zmqshell", "ipykernel.iostream",
                  "jupyter_client.session", "zmq.sugar.socket",
                  "weakref", "_weakrefset",  # the seal's record of the student's threads
                  # what telling the library's code from the notebook's reads: file names,
                  # the cached code of a source file
                  "posixpath", "genericpath", "marshal", "importlib.util",
                  "importlib._bootstrap_external")
_NOT_SEALED = ("mlsys_lab.grading",)
#: Names the kernel itself sets and resets around each cell (ipykernel forwards ``input`` and
#: installs its own hooks per request).
_KERNEL_NAMES = {"builtins": frozenset({"exit", "quit", "get_ipython", "display", "input",
                                        "raw_input", "_", "__", "___"}),
                 "getpass": frozenset({"getpass"})}
_SEAL_NAME = "__mlsys_lab_seal_{}__"
_LOCAL_SEAL: dict | None = None


_SEALED_TOPS = frozenset(m.partition(".")[0] for m in SEALED_MODULES)


def _sealed_name(name: str) -> bool:
    return (name.partition(".")[0] in _SEALED_TOPS
            and any(name == m or name.startswith(m + ".") for m in SEALED_MODULES)
            and not any(name == m or name.startswith(m + ".") for m in _NOT_SEALED))


def _baseline() -> dict[int, types.CodeType]:
    """Every code object the loaded modules hold (their functions, classes' methods, wrappers'
    functions, nested code), by id: the code that is not the student's."""
    found: dict[int, types.CodeType] = {}
    seen: set[int] = set()

    def add_code(code):
        for c in _codes(code):
            found[id(c)] = c

    def visit(obj, depth=0):
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            add_code(obj.__code__)
            inner = getattr(obj, "__wrapped__", None)
            if inner is not None:
                visit(inner, depth + 1)
            return
        if isinstance(obj, (staticmethod, classmethod, types.MethodType)):
            visit(obj.__func__, depth + 1)
            return
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f, depth + 1)
            return
        if isinstance(obj, type):
            try:
                members = list(vars(obj).values())
            except TypeError:
                return
            for member in members:
                visit(member, depth + 1)
            return
        # Wrappers (Numba dispatchers, partials, numpy's dispatchers, @graph_pass objects): read
        # what they hold without getattr, which may import or create things (six, pytest.mark).
        if isinstance(obj, functools.partial):
            held = [obj.func]
        elif type(obj).__name__ == "_ArrayFunctionDispatcher":
            held = [getattr(obj, "_implementation", None)]
        else:
            try:
                state = object.__getattribute__(obj, "__dict__")
            except Exception:  # no instance dict
                return
            held = [state.get(n) for n in ("py_func", "func", "fn", "__wrapped__")
                    if isinstance(state, dict)]
        for inner in held:
            if isinstance(inner, (types.FunctionType, type)):
                visit(inner, depth + 1)

    main = sys.modules.get("__main__")
    for module in list(sys.modules.values()):
        if module is main:  # the notebook's own namespace (``check()`` seals late)
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        for value in values:
            if isinstance(value, types.ModuleType):
                continue
            try:
                visit(value)
            except Exception:  # an exotic object whose attributes fail: not code
                pass
    return found


def _baseline_alive() -> dict[int, types.CodeType]:
    """``_baseline`` for a kernel where no student code has run yet: the code of every function
    object alive (the collector tracks them all). The code nested in it (closures,
    comprehensions) is looked for when it first runs (``_nested_in_sealed``): walking every
    function's constants here took a third of the seal."""
    function = types.FunctionType
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    return {id(c): c for c in [fn.__code__ for fn in gc.get_objects()
                               if type(fn) is function and fn.__globals__ is not main]}


def _nested(codes: list[types.CodeType]) -> dict[int, types.CodeType]:
    """Every code object nested in ``codes``, by id."""
    found: dict[int, types.CodeType] = {}
    code_type = types.CodeType
    while codes:  # one level of nesting a pass, in comprehensions (a third faster than a stack)
        codes = [k for c in codes for k in c.co_consts
                 if type(k) is code_type and id(k) not in found]
        found.update(zip(map(id, codes), codes))
    return found


def _nested_in_sealed(state: dict, code: types.CodeType) -> bool:
    """Whether ``code`` is nested in code the seal recorded, by identity: among the constants
    of the recorded code of the file ``code`` names (collected once per file per kernel; the
    recorded code is grouped by file when code first asks)."""
    nested = state.get("nested")
    if nested is None:
        codes = list(state["codes"].values())
        nested = state["nested"] = {"codes": codes, "by_file": None, "found": {},
                                    "files": frozenset(map(_CO_FILENAME, codes))}
    filename = code.co_filename
    if filename not in nested["files"]:  # a module imported since (the late seal asks for all)
        return False
    found = nested["found"].get(filename)
    if found is None:
        by_file = nested["by_file"]
        if by_file is None:
            by_file = nested["by_file"] = {}
            for c in nested["codes"]:
                by_file.setdefault(c.co_filename, []).append(c)
        found = nested["found"][filename] = _nested(by_file[filename])
    return found.get(id(code)) is code


_CO_FILENAME = operator.attrgetter("co_filename")


def _function_of(value: Any) -> Any:
    """The function a class member holds: a staticmethod's or classmethod's, else itself (by
    the real class: ``isinstance`` would ask a lying ``__class__``, the student's code)."""
    return value.__func__ if issubclass(type(value), (staticmethod, classmethod)) else value


def _snapshot_members(owner: Any) -> dict[str, tuple]:
    """name -> (object, its __code__, its __defaults__, its __kwdefaults__) for every callable or
    module in ``owner``'s namespace."""
    out = {}
    try:
        items = list(vars(owner).items())
    except TypeError:
        return out
    function = types.FunctionType
    for name, value in items:
        if type(value) is function:
            out[name] = (value, value.__code__, value.__defaults__, value.__kwdefaults__)
            continue
        # By the real class, never ``isinstance``: it asks a lying ``__class__`` (a late seal
        # looks at modules the notebook may have filled with its own objects).
        if not (callable(value) or issubclass(type(value), _MEMBER_KINDS)):
            continue
        fn = _function_of(value)
        if type(fn) is function:
            out[name] = (value, fn.__code__, fn.__defaults__, fn.__kwdefaults__)
        else:
            out[name] = (value, None, None, None)
    return out


_MEMBER_KINDS = (types.ModuleType, staticmethod, classmethod, property)
_PLAIN_MEMBERS = frozenset({types.FunctionType, staticmethod, classmethod, property,
                            types.MethodType, functools.partial, types.ModuleType})


def _sealed_kernels(modules: dict[str, tuple]) -> dict[int, tuple[Any, types.CodeType]]:
    """id -> (dispatcher, its ``py_func``'s code) for every Numba dispatcher a sealed module
    holds. ``_dispatcher_label_of`` reads the code here too: a ``py_func`` swapped after the
    seal does not change what the dispatcher runs, and overloads loaded from Numba's disk
    cache carry their type annotation as text, without the code they were compiled from."""
    mod = sys.modules.get("numba.core.dispatcher")
    if mod is None:
        return {}
    cuda = getattr(sys.modules.get("numba.cuda.dispatcher"), "CUDADispatcher", None)
    kinds = (mod.Dispatcher,) + ((cuda,) if isinstance(cuda, type) else ())
    found = {}
    for _, members in modules.values():
        for value, *_ in members.values():
            try:
                if not isinstance(value, kinds):
                    continue
            except Exception:  # an object whose __class__ lies
                continue
            code = getattr(getattr(value, "py_func", None), "__code__", None)
            if isinstance(code, types.CodeType):
                found[id(value)] = (value, code)
    return found


def _channel_objects() -> list[tuple[str, Any]]:
    """The objects a payload passes through on its way out of an IPython kernel."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    if shell is None:
        return []
    pub = getattr(shell, "display_pub", None)
    session = getattr(pub, "session", None)
    socket = getattr(pub, "pub_socket", None)
    return [(n, o) for n, o in (("the kernel's shell", shell), ("its display publisher", pub),
                                ("its session", session), ("its socket", socket))
            if o is not None]


def seal(key: str | None = None, exercise_ids: Iterable[str] = (),
         references: str | None = None) -> dict:
    """Record, before any student cell runs, what the grader's checks rely on in this kernel.

    The grader runs this first in every kernel it starts. It imports the exercises' chapter
    modules, then records: the code objects the loaded modules hold (``_baseline``; with a
    ``key``, in a kernel no student cell has run in yet, every function alive: any other code
    is the student's, whatever its file name, unless it is installed code as it is on disk),
    the threads already running, the functions and classes of ``SEALED_MODULES`` (``tampered``
    compares with them), the objects a payload leaves through, and private references to the
    JSON decoder (the plan's way in), the JSON encoder and the display publisher. The
    forbidden functions are not imported nor fingerprinted here: a probe compiles what it needs
    of them from their files, once per kernel. ``key`` (the grader's secret) names where it is
    kept for the hidden cells. ``references``: the JSON text of ``reference_plan()``, which every
    plan names by digest (or given later, ``seal_references``; without it, the first guard
    computes it in the kernel).
    """
    from mlsys_lab.grading.core.exercise import get_exercise
    for ex_id in exercise_ids:
        try:
            get_exercise(ex_id)
        except Exception:  # an unknown exercise: the grader reports it
            continue
    # The forbidden functions are not imported here: their code and n-grams are compiled from
    # their files when a probe first needs them (``_code_at``), and library code loaded after
    # the seal is recognised as it is on disk (``_as_on_disk``).
    forbidden = {_where(code): code for code in _CODE_OF_FP.values()}
    import json.decoder
    import json.encoder
    try:
        from IPython.display import publish_display_data
    except ImportError:
        publish_display_data = None
    modules, classes = {}, {}
    for name, module in list(sys.modules.items()):
        if module is None or not _sealed_name(name):
            continue
        members = _snapshot_members(module)
        for value, *_ in members.values():
            if (isinstance(value, type) and getattr(value, "__module__", None) == name
                    and not _immutable(value)):
                classes[f"{name}.{value.__qualname__}"] = (value, _snapshot_members(value))
        modules[name] = (module, _module_members(name, members))
    channel = [(label, obj, type(obj), _snapshot_members(obj)) for label, obj in
               _channel_objects()]
    native = native_hook.build()  # compiled here, once per kernel
    start = getattr(threading.Thread.start, "__code__", None)
    state = {
        # A keyed seal runs in a fresh kernel before any student cell: every function alive
        # is the library's, and the collector lists them faster than walking the modules.
        "codes": _baseline_alive() if key is not None else _baseline(),
        "forbidden": forbidden,
        "grams": {},
        "similar": {},
        "threads": set(sys._current_frames()),
        "modules": modules,
        "classes": classes,
        "frozen": _frozen(modules, classes, native_hook.gatherer(native)),
        "channel": channel,
        "kernels": _sealed_kernels(modules),
        "encoder": json.encoder.JSONEncoder,
        "decoder": json.decoder.JSONDecoder,
        "publish": publish_display_data,
        "thread_start": start,
        "start_new_thread": tuple(getattr(sys.modules["_thread"], n) for n in (
            "start_new_thread", "start_joinable_thread") if hasattr(sys.modules["_thread"], n)),
        "keyed": key is not None,
        "active": None,  # the guard that is on now
        "hooked": {},  # ident -> thread: threads started while a probe ran (they are watched)
        "origins": {},  # id(code) -> (code, its module or None, whether it is the student's)
        "files": {"modules": -1, "map": {}},  # source file -> module, for the closed probe
        "student_threads": weakref.WeakSet(),  # threads the student's code started
        "native": native,  # the native profile hook (``native_hook``), or None
        "late": [],  # the records of sealed modules first imported since (``_seal_late``)
        "late_done": set(sys.modules),  # every module seen: recorded or not sealed
        "sys_modules": sys.modules,  # the import system's table (``sys.modules`` can be rebound)
        "references": None,  # the grader's (``seal_references``), indexed by the first guard
    }
    if references is not None:
        _keep_references(state, references)
    state["late_watch"] = _late_watch(state["frozen"]["gather"])
    if key is not None:
        import builtins
        vars(builtins)[_SEAL_NAME.format(key)] = state
    return state


def seal_references(key: str, references: str) -> None:
    """Give the seal recorded under ``key`` the grader's references: ``reference_plan()``'s
    JSON, which every plan names by digest. The grader's second cell in a kernel, still before
    any student cell (the grader makes them while the first one runs)."""
    state = find_seal(key)
    if state is not None:
        _keep_references(state, references)


def _keep_references(state: dict, references: str) -> None:
    state["references"] = {"digest": hashlib.sha256(references.encode()).hexdigest(),
                           "entries": json.decoder.JSONDecoder().decode(references),
                           "tables": None}


def _share_caches(state: dict) -> None:
    """Keep this module's caches (files compiled as on disk, real paths, fingerprints and
    n-grams of code objects, roots of installed code) in the seal: the hidden cell loads a
    fresh copy of this module for every check, whose own caches would start empty."""
    global _ON_DISK, _REALPATH, _IDENTITY, _GRAMS, _ROOTS
    caches = state.get("caches")
    if caches is None:
        caches = state["caches"] = {"on_disk": _ON_DISK, "realpath": _REALPATH,
                                    "identity": _IDENTITY, "grams": _GRAMS, "roots": _ROOTS}
    _ON_DISK, _REALPATH, _IDENTITY, _GRAMS, _ROOTS = (caches[k] for k in (
        "on_disk", "realpath", "identity", "grams", "roots"))


def find_seal(key: str) -> dict | None:
    """The seal the grader's first cell recorded under ``key``, or None."""
    import builtins
    state = vars(builtins).get(_SEAL_NAME.format(key))
    return state if isinstance(state, dict) and state.get("keyed") else None


def _local_seal() -> dict:
    """For ``check()`` in a notebook (no grader): a seal taken the first time a guard is made."""
    global _LOCAL_SEAL
    if _LOCAL_SEAL is None:
        _LOCAL_SEAL = seal()
    return _LOCAL_SEAL


_HEAPTYPE, _IMMUTABLETYPE = 1 << 9, 1 << 8  # Py_TPFLAGS_HEAPTYPE, Py_TPFLAGS_IMMUTABLETYPE
# A class's own namespace, method order and flags, read past any metaclass (``vars(cls)``,
# ``cls.__mro__`` would ask a metaclass's ``__getattribute__``: the student's code).
_CLASS_DICT = type.__dict__["__dict__"].__get__
_CLASS_MRO = type.__dict__["__mro__"].__get__
_CLASS_FLAGS = type.__dict__["__flags__"].__get__
_CLASS_NAME = type.__dict__["__qualname__"].__get__


def _immutable(cls: type) -> bool:
    """Whether ``cls``'s namespace cannot be changed (``setattr`` raises TypeError): a static
    (builtin) type or one flagged immutable, as most C extensions' types (``numpy.ndarray``);
    the seal does not record them."""
    flags = _CLASS_FLAGS(cls)
    return not flags & _HEAPTYPE or bool(flags & _IMMUTABLETYPE)


def _changed(old: tuple, new: Any) -> bool:
    value, code, defaults, kwdefaults = old
    if new is not value:
        return True
    if code is not None:
        fn = _function_of(value)
        return (fn.__code__ is not code or fn.__defaults__ is not defaults
                or fn.__kwdefaults__ is not kwdefaults)
    return False


_GET_CODE, _GET_DEFAULTS, _GET_KWDEFAULTS = map(operator.attrgetter, (
    "__code__", "__defaults__", "__kwdefaults__"))


def _frozen(modules: dict[str, tuple], classes: dict[str, tuple], gather,
            ops: tuple | None = None) -> dict:
    """Every sealed namespace's members as the seal saw them, as plain data for
    ``_frozen_same``: per namespace (a module's dict, a class's), the names, the objects and
    where ``gather`` finds its version; every sealed function with its code and defaults; and
    the builtins the comparison uses, as they were before any student cell ran (``ops``: the
    seal's, for a module sealed late). Plain data, and
    the functions that read it are the caller's own (the hidden cell's private copy of this
    module): a method on a class of the kernel's own module is something a notebook can
    replace (it once answered "nothing changed" for whatever the notebook had replaced)."""
    import ctypes

    spaces = []  # (namespace, names, objects)
    functions, code = [], []
    for owner, members in [*modules.values(), *classes.values()]:
        try:
            space = vars(owner)  # a module's dict; a class's (live) mapping proxy
        except TypeError:
            continue
        spaces.append((space, tuple(members), tuple(old[0] for old in members.values()),
                       len(space) if type(space) is not dict else None))  # a class: its size
        for old in members.values():
            if old[1] is not None:
                functions.append(_function_of(old[0]))
                code.append(old[1:])  # code, defaults, kwdefaults
    frozen = {
        "names": tuple(modules), "modules": tuple(module for module, _ in modules.values()),
        "spaces": spaces, "functions": tuple(functions),
        "code": tuple(c[0] for c in code), "defaults": tuple(c[1] for c in code),
        "kwdefaults": tuple(c[2] for c in code),
        "ops": ops or (all, map, len, range, operator.is_, operator.getitem, sys.modules.get,
                       bytes, _GET_CODE, _GET_DEFAULTS, _GET_KWDEFAULTS),
        "gather": None,
    }
    dicts = [gc.get_referents(space) if type(space) is not dict else [space]
             for space, *_ in spaces]
    # A class's namespace is a dict, or a subclass of it (ctypes' classes): its version is
    # where a dict keeps it. Another kind would be compared name by name every time.
    dicts = [d[0] if len(d) == 1 and issubclass(type(d[0]), dict) else None for d in dicts]
    frozen["always"] = [i for i, d in enumerate(dicts) if d is None]
    if gather is not None:
        # One word per namespace (its dict's version), then sys.modules', then three per
        # function (its code, defaults and keyword defaults): read again in one native call,
        # the same bytes mean nothing the seal recorded can have changed.
        at = native_hook.WORD_LAYOUT
        still = id(frozen["always"]) + 8 * 1  # a word that does not change: the list's type
        addresses = [id(d) + 8 * at["dict_version"] if d is not None else still for d in dicts]
        addresses.append(id(sys.modules) + 8 * at["dict_version"])
        fields = np.array([8 * at[k] for k in (
            "function_code", "function_defaults", "function_kwdefaults")], np.int64)
        ids = np.fromiter(map(id, functions), np.int64, len(functions))
        addresses = np.concatenate([np.array(addresses, np.int64),
                                    (ids[:, None] + fields).ravel()])
        n = len(addresses)
        frozen["dicts"] = dicts  # held: their addresses stay theirs
        frozen["addresses"] = (ctypes.c_int64 * n).from_buffer_copy(addresses)
        frozen["now"] = (ctypes.c_int64 * n)()
        gather(frozen["addresses"], frozen["now"], n)
        frozen["words"] = bytes(frozen["now"])  # the record: compared as bytes
        frozen["gather"] = gather
    return frozen


def _frozen_same(frozen: dict) -> str:
    """What changed of what the seal recorded: ``""`` when every sealed module is still the one
    in ``sys.modules``, every name still holds the same object and every function the same
    code and defaults (compared by identity: ``==`` could run the student's code);
    ``"changed"`` when one of those changed; else ``"grew"`` when a sealed class only gained or
    lost a name (``tampered`` then looks for a method that shadows a base class's).

    With the native reader, the namespaces and functions whose words (``_frozen``) are as
    recorded are unchanged; only the others are compared name by name, and when nothing
    changed, the words are recorded again (a kernel adds names to modules as it runs)."""
    all_, map_, len_, range_, is_, getitem, modules_get, bytes_, get_code, get_defaults, get_kw = \
        frozen["ops"]
    gather = frozen["gather"]
    spaces = frozen["spaces"]
    if gather is None:
        changed, functions_changed, modules_changed = range_(len_(spaces)), True, True
    else:
        words, now = frozen["words"], frozen["now"]
        gather(frozen["addresses"], now, len_(now))
        now = bytes_(now)
        always = frozen["always"]
        if now == words and not always:
            return ""
        count = len_(spaces)
        changed = [i for i in range_(count) if now[8 * i:8 * i + 8] != words[8 * i:8 * i + 8]]
        changed += always
        modules_changed = now[8 * count:8 * count + 8] != words[8 * count:8 * count + 8]
        functions_changed = now[8 * (count + 1):] != words[8 * (count + 1):]
    if modules_changed and not all_(map_(is_, map_(modules_get, frozen["names"],
                                                   frozen["modules"]), frozen["modules"])):
        return "changed"
    grew = False
    for i in changed:
        space, names, objects, size = spaces[i]
        try:
            if not all_(map_(is_, map_(getitem, (space,) * len_(names), names), objects)):
                return "changed"
        except KeyError:  # a name was deleted
            return "changed"
        grew = grew or (size is not None and len_(space) != size)
    if functions_changed and not (
            all_(map_(is_, map_(get_code, frozen["functions"]), frozen["code"]))
            and all_(map_(is_, map_(get_defaults, frozen["functions"]), frozen["defaults"]))
            and all_(map_(is_, map_(get_kw, frozen["functions"]), frozen["kwdefaults"]))):
        return "changed"
    if grew:
        return "grew"  # words kept: the class is looked at again every time
    if gather is not None:
        frozen["words"] = now  # nothing changed that matters: compare with today's words next
    return ""


def _module_members(name: str, members: dict[str, tuple]) -> dict[str, tuple]:
    """What ``tampered`` compares of a sealed module: not the names a kernel rebinds itself."""
    skip = _KERNEL_NAMES.get(name, ())
    return {attr: old for attr, old in members.items()
            if attr not in skip and not (name == "sys" and attr.endswith("hook"))}


def tampered(state: dict) -> list[str]:
    """What the notebook changed of what the seal recorded: a replaced module, function, method
    or class, a function's code or defaults swapped, an object on the result's way out patched;
    and, in a sealed module first imported since (``_seal_late``), a member that is not the
    library's code. An empty list when nothing changed."""
    found = []
    missing = object()
    verdicts = [_frozen_same(frozen) for frozen in (state["frozen"], *state["late"])]
    verdict = "changed" if "changed" in verdicts else "grew" if "grew" in verdicts else ""
    sealed = not verdict
    for name, (module, members) in () if sealed else state["modules"].items():
        if sys.modules.get(name, module) is not module:
            found.append(f"`sys.modules[{name!r}]`")
            continue
        try:
            now = vars(module)
        except TypeError:
            continue
        for attr, old in members.items():
            if _changed(old, now.get(attr, missing)):
                found.append(f"`{name}.{attr}`")
    for name, (cls, members) in () if sealed else state["classes"].items():
        now = vars(cls)
        for attr, old in members.items():
            if _changed(old, now.get(attr, missing)):
                found.append(f"`{name}.{attr}`")
        for attr, value in now.items():  # a method added that shadows a base class's
            if attr not in members and callable(value) and any(
                    attr in vars(base) for base in cls.__mro__[1:]):
                found.append(f"`{name}.{attr}`")
    for label, obj, kind, members in state["channel"]:
        if type(obj) is not kind:
            found.append(label)
            continue
        now = vars(obj)
        for attr, old in members.items():
            if _changed(old, now.get(attr, missing)):
                found.append(f"{label}'s `{attr}`")
        for attr, value in now.items():
            if attr not in members and callable(value) and hasattr(kind, attr):
                found.append(f"{label}'s `{attr}`")
    if verdict == "changed" and not found:  # the names could not be found again: still changed
        found.append("a function or module the check relies on")
    return found or _seal_late(state)


# ----------------------------------------------------------------------------- the late seal

#: Methods ``dataclasses`` and ``collections.namedtuple`` make from a string: no file says what
#: they should be, so a late seal takes them as they are (see ``_seal_late``).
_GENERATED = frozenset({"__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__",
                        "__ge__", "__hash__", "__setattr__", "__delattr__", "__new__",
                        "__getstate__", "__setstate__", "__replace__"})


def _seal_late(state: dict) -> list[str]:
    """Seal the ``SEALED_MODULES`` first imported since the seal (a chapter's module the
    notebook imported, one a probe imports as it runs): what a probe relies on there must not
    be the notebook's either. Such a module is recorded the first time ``tampered`` sees it,
    when every function, method and callable object it holds is the library's code (known to
    the seal, or as its file on disk compiles it: ``_trusted``); ``tampered`` compares with that
    record from then on. A module holding anything else is not recorded: each of those members
    is named, every time. Never runs the notebook's code (no ``isinstance``, no ``getattr`` on
    its objects)."""
    late, done, table = state["late"], state["late_done"], state["sys_modules"]
    watch = state["late_watch"]  # sys.modules' version when last looked, where it can be read
    if watch is not None:
        watch["gather"](watch["address"], watch["now"], 1)
        if watch["now"][0] == watch["seen"] and not watch["foreign"]:
            return []
        watch["seen"] = watch["now"][0]
    names = [name for name in list(table) if name not in done]
    found, modules, classes = [], {}, {}
    checked = state.setdefault("late_classes", {})  # id -> class whose methods are the library's
    for name in names:
        module = table.get(name)
        if module is None or not _sealed_name(name):
            done.add(name)
            continue
        foreign = _foreign_members(state, name, module, checked)
        if foreign:
            found += foreign
            continue
        done.add(name)
        members = _snapshot_members(module)
        modules[name] = (module, _module_members(name, members))
        for value, *_ in members.values():
            if (issubclass(type(value), type) and _CLASS_DICT(value).get("__module__") == name
                    and not _immutable(value)):
                classes[f"{name}.{_CLASS_NAME(value)}"] = (value, _snapshot_members(value))
    if modules:
        state["modules"].update(modules)
        state["classes"].update(classes)
        state["kernels"].update(_sealed_kernels(modules))
        late.append(_frozen(modules, classes, state["frozen"]["gather"], state["frozen"]["ops"]))
    if watch is not None:
        watch["foreign"] = bool(found)  # named again next time, whatever was imported
    return found


def _late_watch(gather) -> dict | None:
    """Where ``_seal_late`` reads ``sys.modules``' version (nothing imported since it last
    looked: nothing to look at), or None where words cannot be read (it looks every time)."""
    if gather is None:
        return None
    import ctypes
    address = id(sys.modules) + 8 * native_hook.WORD_LAYOUT["dict_version"]
    return {"gather": gather, "address": (ctypes.c_int64 * 1)(address),
            "now": (ctypes.c_int64 * 1)(), "seen": None, "foreign": False}


def _foreign_members(state: dict, name: str, module: Any, checked: dict) -> list[str]:
    """The members of a module (``name``) that are not the library's code, as labels."""
    found = []
    if type(module) is not types.ModuleType and _foreign_class(state, type(module), checked):
        return [f"`sys.modules[{name!r}]`"]
    for attr, value in list(vars(module).items()):
        kind = type(value)
        if kind is types.ModuleType:
            continue  # a module is sealed (or not) under its own name
        if kind is type or issubclass(kind, type):
            bad = _foreign_class(state, value, checked)
        else:
            bad = (_foreign_value(state, value, None) or _foreign_class(state, kind, checked)
                   or _foreign_wrapped(state, value, checked))
        if bad:
            found.append(f"`{name}.{attr}`" + (f" (`{bad}`)" if bad is not True else ""))
    return found


def _foreign_value(state: dict, value: Any, attr: str | None) -> bool:
    """Whether a function (or what a staticmethod, classmethod, bound method, property or
    partial holds) is not the library's code. ``attr``: the class member's name, for the
    methods ``dataclasses`` and ``namedtuple`` generate."""
    kind = type(value)
    if kind in (staticmethod, classmethod, types.MethodType):
        return _foreign_value(state, value.__func__, attr)
    if kind is property:
        return any(_foreign_value(state, f, attr) for f in (value.fget, value.fset, value.fdel)
                   if f is not None)
    if kind is functools.partial:
        return _foreign_value(state, value.func, attr)
    if kind is not types.FunctionType:
        return False  # an object: its class is looked at
    code = value.__code__
    if not _is_student(state, code):
        return False
    return not (attr in _GENERATED and _synthetic(code.co_filename))


def _foreign_wrapped(state: dict, value: Any, checked: dict) -> bool:
    """Whether an object of a library class (a cache wrapper, a Numba dispatcher) wraps a
    function of the notebook's (``_WRAPPED``, in its own namespace: read without asking its
    class, which was found to be the library's)."""
    try:
        space = object.__getattribute__(value, "__dict__")
    except Exception:  # no instance namespace
        return False
    if type(space) is not dict:
        return False
    for name in _WRAPPED:
        inner = space.get(name)
        if inner is not None and (_foreign_value(state, inner, None) or (
                type(inner) not in _PLAIN_MEMBERS and _foreign_class(state, type(inner),
                                                                     checked))):
            return True
    return False


def _foreign_class(state: dict, cls: type, checked: dict) -> str | bool:
    """The first method (``Class.name``) of ``cls``, its bases or its metaclass's that is not
    the library's code; False when there is none (each class looked at once)."""
    for klass in (*_CLASS_MRO(cls), *_CLASS_MRO(type(cls))):
        if checked.get(id(klass)) is klass:
            continue
        checked[id(klass)] = klass  # first: a member may be an instance of the class (an enum)
        if _immutable(klass):
            continue
        for attr, member in list(_CLASS_DICT(klass).items()):
            kind = type(member)
            if _foreign_value(state, member, attr) or (
                    kind not in _PLAIN_MEMBERS and kind is not type
                    and _foreign_class(state, kind, checked)):
                del checked[id(klass)]
                return f"{_CLASS_NAME(klass)}.{attr}"
    return False


def _trusted(state: dict, code: types.CodeType) -> bool:
    """Whether ``code`` is not the student's: held by a module when the seal was taken, or
    installed code as it is on disk (the grading package's private copies, a library module
    imported since)."""
    return (state["codes"].get(id(code)) is code or _nested_in_sealed(state, code)
            or _as_on_disk(code))


def _forbidden_code(state: dict, where: tuple, fp: str) -> types.CodeType | None:
    """A forbidden function's code: the seal's, the one the plan was made from (``check()``),
    or compiled from its file."""
    where = tuple(where)
    return state["forbidden"].get(where) or _CODE_OF_FP.get(fp) or _code_at(where)


def _grams_of(state: dict, fp: str, where: tuple) -> frozenset | None:
    grams = state["grams"].get(fp)
    if grams is None:
        code = _forbidden_code(state, where, fp)
        if code is None:
            return None
        grams = state["grams"][fp] = shingles(code)
    return grams


def _similar(state: dict, code: types.CodeType, fps: dict[str, int | None],
             where_of: dict[str, tuple], sketches: dict[str, list[int]] | None = None
             ) -> list[str]:
    """Those of the forbidden functions ``fps`` (fingerprint -> n-gram count) that ``code`` is a
    copy of (Jaccard similarity of their n-grams at least ``SIMILAR``); each pair is compared
    once per kernel, and only functions of about the same size whose ``sketches`` (where the
    plan has them) allow it are looked at."""
    known = state["similar"].get(id(code))
    if known is None or known[0] is not code:
        known = state["similar"][id(code)] = (code, {})  # holds it: its id is not reused
    verdicts = known[1]
    mine = shingles(code)
    n = len(mine)
    mine_sketch = sketch(code)
    for fp, count in fps.items():
        if fp in verdicts:
            continue
        if count is not None and (not n or min(n, count) < SIMILAR * max(n, count)):
            verdicts[fp] = False  # Jaccard <= min / max
            continue
        other = sketches.get(fp) if sketches else None
        if (other is not None and len(other) == len(mine_sketch)
                and not may_be_similar(mine_sketch, other)):
            verdicts[fp] = False
            continue
        grams = _grams_of(state, fp, where_of[fp])
        if grams is None:
            continue
        m = len(grams)
        if not n or min(n, m) < SIMILAR * max(n, m):  # Jaccard <= min / max
            verdicts[fp] = False
            continue
        common = len(mine & grams)
        verdicts[fp] = common >= SIMILAR * (n + m - common)
    return [fp for fp in fps if verdicts.get(fp)]


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


# ----------------------------------------------------------------------------- the closed probe

#: Always allowed, whatever the exercise: the import statement's machinery (importing is not
#: running: a module that is not allowed still refuses when it is called), the kernel's own
#: output path (``print`` in the student's code writes through ipykernel's streams), progress
#: bars (tqdm) and pytest's capture.
_KERNEL_IO = ("importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
              "_frozen_importlib_external", "_imp", "zipimport", "ipykernel", "IPython", "zmq",
              "jupyter_client", "traitlets", "tornado", "comm", "tqdm", "_pytest", "_io", "io",
              "codecs", "encodings")
_STDLIB = frozenset(sys.stdlib_module_names)
_IMPORTING = ("importlib._bootstrap", "_frozen_importlib")


def _allowlist(entries: Iterable[str]) -> tuple[dict[str, bool], ...]:
    """An exercise's ``allowed`` entries as one table: module -> permitted (``-`` refuses)."""
    table = {name: True for name in _KERNEL_IO}
    for entry in entries:
        table[entry.lstrip("-")] = not entry.startswith("-")
    return (table,)


def _permits(allowed: tuple[dict[str, bool], ...], module: str) -> bool:
    """Whether ``module`` may run: the longest allowlist entry that is it or a package above it
    says so."""
    table = allowed[0]
    name = module
    while True:
        verdict = table.get(name)
        if verdict is not None:
            return verdict
        name, dot, _ = name.rpartition(".")
        if not dot:
            return False


def _module_of(state: dict, filename: str) -> str | None:
    """The module a source file is loaded as (``sys.modules``), or None. Looked up by the file
    name as the loader gave it (a module's ``__file__`` is its code's ``co_filename``), then by
    its real path (a symlinked or relative name)."""
    files = state["files"]
    raw, real = files["map"], files.setdefault("real", {})
    module = raw.get(filename)
    if module is not None:
        return module
    if files["modules"] != len(sys.modules):
        done = files.setdefault("done", set())
        for name, mod in list(sys.modules.items()):
            if name not in done:
                done.add(name)
                path = getattr(mod, "__file__", None)
                if isinstance(path, str):
                    raw.setdefault(path, name)
                    files.setdefault("pending", []).append((path, name))
        files["modules"] = len(sys.modules)
        module = raw.get(filename)
        if module is not None:
            return module
    if filename.startswith("<"):
        return None
    for path, name in files.pop("pending", ()):  # real paths only when a name did not match
        real.setdefault(_realpath(path), name)
    return real.get(_realpath(filename))


def _realpath(name: str) -> str:
    path = _REALPATH.get(name)
    if path is None:
        path = _REALPATH[name] = os.path.realpath(name)
    return path


def _claimed_module(state: dict, code: types.CodeType) -> str | None:
    """The module ``code``'s file name says it belongs to (true for the library's code; the
    student's may claim any), or None."""
    filename = code.co_filename
    if filename.startswith("<frozen "):
        return filename[8:-1]
    if _synthetic(filename):
        return None
    return _module_of(state, filename)


def _origin(state: dict, code: types.CodeType) -> tuple[str | None, bool]:
    """(the module ``code`` belongs to, or None when unknown; whether it is the student's).

    The student's code is code the seal does not know and that is not installed code as it is
    on disk (``_trusted``), whatever file name it claims; once per kernel per code object.
    """
    student = _is_student(state, code)
    known = state["origins"][id(code)]
    if known[1] is _NOT_YET:
        # Made from a string (namedtuples, dataclasses), the library's code is nobody's module.
        module = None if student else _claimed_module(state, code)
        if module is not None or student:  # else looked up again: its module may come later
            state["origins"][id(code)] = (code, module, student)
        return module, student
    return known[1], student


# An origin's module not looked up yet: a value, not an object of its own, since every private
# copy of this module (one per check) reads the same table.
_NOT_YET = False


def _is_student(state: dict, code: types.CodeType) -> bool:
    """``_origin``'s second half, without looking up the module (the late seal needs only it)."""
    known = state["origins"].get(id(code))
    if known is not None and known[0] is code:
        return known[2]
    student = not _trusted(state, code)
    state["origins"][id(code)] = (code, _NOT_YET, student)  # holds it: its id is not reused
    return student


def _c_module(builtin: Any) -> str | None:
    """The module a C function Python code calls comes from: its module, or the module of the
    class that defines the method (``list.append``: builtins)."""
    owner = getattr(builtin, "__self__", None)
    if issubclass(type(owner), types.ModuleType):  # by the real class: ``__class__`` may lie
        return owner.__name__
    if owner is None:
        return getattr(builtin, "__module__", None)
    name = getattr(builtin, "__name__", None)
    for cls in owner.__mro__ if issubclass(type(owner), type) else type(owner).__mro__:
        if name in vars(cls):
            return getattr(cls, "__module__", None)
    return None


_TABLES = ("by_where", "by_synthetic", "by_fp", "gram_counts", "sketches", "by_clone",
           "where_of_fp")


def _tables(entries: Iterable[dict]) -> dict[str, dict]:
    """A plan's forbidden-code entries indexed as the guard looks them up (``_TABLES``)."""
    by_where, by_synthetic, by_fp, gram_counts, sketches, by_clone, where_of_fp = tables = tuple(
        {} for _ in _TABLES)
    for e in entries:
        fp, label = e["fp"], e["label"]
        where = where_of_fp[fp] = _entry_where(e)
        if _synthetic(e["file"]):
            by_synthetic.setdefault(where, {})[fp] = label
        else:
            by_where[where] = label
        if e["distinctive"]:
            by_fp.setdefault(fp, label)
            gram_counts[fp] = e.get("grams")
            if e.get("sketch") is not None:
                sketches[fp] = e["sketch"]
        if e["size"] >= CLONE:
            by_clone.setdefault(fp, []).append(e)
    return dict(zip(_TABLES, tables))


def _reference_tables(state: dict, digest: str) -> dict[str, Any]:
    """The tables of the grader's references (``reference_plan``) the seal holds, indexed once
    per kernel; where the seal has none under ``digest`` (``check()`` without the grader), those
    of the references this process computes."""
    refs = state.get("references")
    if refs is None or refs["digest"] != digest:
        local = reference_plan()
        refs = state["references"] = {"digest": local["digest"], "entries": local["entries"],
                                      "tables": None}
    if refs["tables"] is None:
        tables: dict[str, Any] = _tables(refs["entries"])
        fps_at: dict[tuple, list[str]] = {}
        for e in refs["entries"]:
            fps_at.setdefault(_entry_where(e), []).append(e["fp"])
        counts = tables["gram_counts"]
        tables.update(fps_at=fps_at, files=frozenset(e["file"] for e in refs["entries"]),
                      counted=sorted((c, fp) for fp, c in counts.items() if c is not None),
                      uncounted=[fp for fp, c in counts.items() if c is None])
        refs["tables"] = tables
    return refs["tables"]


def _with_references(own: dict, shared: dict, excused: set[tuple], plain: set[str]) -> dict:
    """An exercise's tables ``own`` over the references' ``shared`` (left as they are), less
    the references its probes call (``excused``, by where) and the fingerprint matches of code
    like theirs (``plain``): the tables of all the entries indexed together, own first."""
    by_where, by_synthetic, by_clone = (dict(shared[k]) for k in (
        "by_where", "by_synthetic", "by_clone"))
    for where in excused:
        by_where.pop(where, None)
        by_synthetic.pop(where, None)
        for fp in shared["fps_at"].get(where, ()):
            kept = [e for e in by_clone.get(fp, ())
                    if _entry_where(e) != where]
            if kept:
                by_clone[fp] = kept
            else:
                by_clone.pop(fp, None)
    by_where.update(own["by_where"])
    for where, labels in own["by_synthetic"].items():
        by_synthetic[where] = {**by_synthetic.get(where, {}), **labels}
    for fp, entries in own["by_clone"].items():
        by_clone[fp] = entries + by_clone.get(fp, [])
    out = {"by_where": by_where, "by_synthetic": by_synthetic, "by_clone": by_clone,
           "where_of_fp": {**shared["where_of_fp"], **own["where_of_fp"]}}
    for name in ("by_fp", "gram_counts", "sketches"):
        table = out[name] = dict(shared[name])
        for fp in plain:
            table.pop(fp, None)
        table.update(own[name])
    return out


_FORBIDDEN, _TAMPER, _DISPATCH, _SPAWN, _START = 1, 2, 3, 4, 5


def _memo(state: dict, plan: dict, trusted: list[types.FunctionType],
          watched: dict[int, Any]) -> dict:
    """What the guards of ``plan`` (the same object: ``plan_for``'s, or the hidden cell's
    decoded once per kernel, ``decoded_plan``) found in this kernel, for the next one: the
    plan's tables, the verdicts on the code its probes ran (the hook's and the native
    tables'), on the C functions the student's code called, on the dispatchers. Valid while
    the probes' code and the functions watched for tampering are the same objects and the
    hook the same kind (the native tables must list what the verdicts say); a new record
    otherwise, and the guard forgets the verdicts when what it calls a Numba dispatcher's
    method changed (``Guard._start``). (A verdict on a code object depends on the plan, its
    allowlist and the seal only, and each one holds its code object, so the id it is kept
    under stays its own.)"""
    memos = state.setdefault("memos", {})
    codes = [code for fn in trusted for code in _codes(fn.__code__)]
    signature = (tuple(map(id, codes)), tuple(watched), state.get("native") is None)
    memo = memos.get(id(plan))
    if memo is None or memo["plan"] is not plan or memo["signature"] != signature:
        memos.pop(id(plan), None)
        while len(memos) >= _MEMOS:  # the oldest first (a kernel grades a chapter's few)
            memos.pop(next(iter(memos)))
        memo = memos[id(plan)] = {"plan": plan, "signature": signature,
                                  "held": (codes, list(watched.values()))}
    return memo


_MEMOS = 32  # plans whose guards' findings a kernel keeps


def decoded_plan(state: dict | None, text: str) -> dict:
    """A plan's JSON text (the grader's hidden cell carries it) decoded with the decoder the
    seal holds, once per kernel: the same text gives the same plan object, whose guards then
    share what they found (``_memo``). The text itself is the key (``str`` hashing and
    comparison are the interpreter's, which no cell can replace)."""
    if state is None:
        return json.JSONDecoder().decode(text)
    plans = state.setdefault("plans", {})
    plan = plans.get(text)
    if plan is None:
        while len(plans) >= _MEMOS:
            plans.pop(next(iter(plans)))
        plan = plans[text] = state["decoder"]().decode(text)
    return plan


class Guard:
    """Enforces one exercise's plan around each probe (see the module docstring).

    Example:
        >>> guard = Guard(plan_for(exercise))          # doctest: +SKIP
        >>> with guard.watching():                      # doctest: +SKIP
        ...     value = probe(answer)
        >>> guard.violations                            # doctest: +SKIP
        []
    """

    def __init__(self, plan: dict, state: dict | None = None, trusted: Iterable[Any] = ()):
        """``trusted``: functions whose code is the grader's wherever it was written (the
        exercise's probes), never the student's."""
        self.task = plan.get("task", "this")
        self._state = state if state is not None else _local_seal()
        _share_caches(self._state)
        self._watched_c = _watched_builtins()
        self._watched_py = _watched_python()
        trusted = [fn for fn in map(_unwrap, trusted) if isinstance(fn, types.FunctionType)]
        # What earlier guards of this plan found in this kernel (``_memo``): its tables, the
        # verdicts on the code and C functions they saw, the dispatchers they looked at.
        memo = self._memo = _memo(self._state, plan, trusted, self._watched_py)
        allowed = plan.get("allowed")
        fresh = "own" not in memo
        if fresh:
            # The plan's entries, indexed: where -> label, fingerprint -> label (big
            # functions: DISTINCTIVE), fingerprint -> entries (CLONE), each big function's
            # n-gram count and sketch (its n-grams are computed when a copy of about its size
            # shows up, once per kernel, ``_similar``). The grader's references, which every
            # plan shares, are indexed once per kernel (``_reference_tables``) and copied under
            # the exercise's own entries.
            tables = own = _tables(plan["code"])
            shared = plan.get("references")
            memo["shared"] = None
            if shared is not None:
                memo["shared"] = _reference_tables(self._state, shared["digest"])
                tables = _with_references(own, memo["shared"], set(map(tuple, shared["excused"])),
                                          set(shared["plain"]))
            memo.update(own=own, tables=tables, counts_sorted=None, by_name=None,
                        allowed=_allowlist(allowed) if allowed is not None else None,
                        forbidden_files=None, seen={}, students={}, c_verdicts={}, clean={},
                        watch=None, native=None, dispatch=None)
        tables = memo["tables"]
        self._own, self._shared = memo["own"], memo["shared"]
        self._by_where: dict[tuple, str] = tables["by_where"]
        self._by_synthetic: dict[tuple, dict[str, str]] = tables["by_synthetic"]  # every
        # dataclass's __init__ comes from ("<string>", 2, ...): where -> {fingerprint: label}
        self._by_fp: dict[str, str] = tables["by_fp"]
        self._gram_counts: dict[str, int | None] = tables["gram_counts"]
        self._sketches: dict[str, list[int]] = tables["sketches"]
        self._by_clone: dict[str, list[dict]] = tables["by_clone"]
        self._where_of_fp: dict[str, tuple] = tables["where_of_fp"]
        self._allowed = memo["allowed"]
        # id(code) -> (code, where, student, foreign): per kernel, per allowlist (``_classify``)
        self._classified: dict[int, tuple] = self._state.setdefault("classified", {}).setdefault(
            tuple(allowed) if allowed is not None else None, {})
        self._permitted: dict[str, bool] = {}
        self._c_verdicts: dict[tuple, tuple] = memo["c_verdicts"]  # see ``_on_c_call``
        self._c_funcs: dict[str, dict[str, str]] = {}
        for e in plan.get("builtins", ()):
            self._c_funcs.setdefault(e["name"], {})[e["owner"]] = e["label"]
        self.violations: list[str] = []
        self._seen: dict[int, tuple] = memo["seen"]  # id(code) -> the hook's verdict
        self._lifted = 0
        self._closing = True
        self._thread = threading.get_ident()
        self._dispatchers: dict[int, tuple[Any, tuple[str, str]]] = {}
        self._entry_points: dict[int, tuple[Any, tuple[str, str]]] = {}
        self._dispatch_codes: dict[int, types.CodeType] = {}
        self._found: list | None = None
        self._off: tuple[tuple, dict] | None = None  # (overload counts, what to switch off)
        self._clean: dict[int, tuple[Any, int]] = memo["clean"]  # dispatchers that run no
        # forbidden code
        self._students: dict[int, types.CodeType] = memo["students"]  # the student's code seen
        # C functions looked up by identity: id -> (function, kind, label)
        self._c_static = {id(f): (f, _SPAWN, None) for f in self._state["start_new_thread"]}
        self._c_static.update((i, (f, _TAMPER, name)) for i, (f, name) in self._watched_c.items())
        self._c_ids = dict(self._c_static)
        self._tables: native_hook.Tables | None = None  # the native hook's, when it is used
        self._published_c_ids: frozenset[int] = frozenset()  # what its c_ids table lists
        self.hook = self._make_hook()
        if self._tables is not None and memo["native"] is not None:
            self._tables.load(memo["native"])
        if fresh:  # (the same probes' code as the last guard of this plan trusted)
            self.trust(trusted)

    def trust(self, functions: Iterable[Any]) -> None:
        """Count these functions' code (an exercise's probes: the grader's) as not the
        student's, wherever it was defined."""
        state = self._state
        for fn in functions:
            fn = _unwrap(fn)
            if isinstance(fn, types.FunctionType):
                for code in _codes(fn.__code__):
                    state["codes"][id(code)] = code
                    state["origins"].pop(id(code), None)
                    for table in state.get("classified", {}).values():
                        table.pop(id(code), None)

    # -- matching -------------------------------------------------------------------------

    def _label(self, code: types.CodeType, where: tuple | None = None,
               student: bool | None = None) -> tuple[str, str] | None:
        """(label, note) when ``code`` is forbidden: its origin matches, or it is a copy.

        Code the seal does not know is the student's, whatever file name it claims: it is
        refused when its instruction stream is a forbidden function's under the same name (a
        clone made with ``code.replace``), or when it is similar to a big one (a pasted copy).
        ``where`` and ``student``: ``_where(code)`` and ``_is_student``, where known.
        """
        if where is None:
            where = _where(code)
        label = self._by_where.get(where)
        if label is None and where in self._by_synthetic:
            label = self._by_synthetic[where].get(fingerprint(code))
        if label is not None:
            return label, ""
        if not (self._by_fp or self._by_clone):
            return None
        if not (student if student is not None else _is_student(self._state, code)):
            return None
        if len(code.co_code) < 2 * CLONE:  # every instruction is at least 2 bytes
            return None
        name = where[2].rpartition("<locals>.")[2]
        fp, size = _identity(code)
        label = self._clone_of(code, fp, where[2])
        if label is None and size >= DISTINCTIVE and self._by_fp:
            label = self._by_fp.get(fp)
            if label is None:
                matches = _similar(self._state, code, self._similar_candidates(code),
                                   self._where_of_fp, self._sketches)
                label = self._by_fp[matches[0]] if matches else None
        if label is not None:
            return label, f" (your `{name}` is a copy of its code)"
        return None

    def _similar_candidates(self, code: types.CodeType) -> dict[str, int | None]:
        """The big forbidden functions ``code`` could be a copy of: those whose n-gram count is
        within a factor ``SIMILAR`` of its own (Jaccard similarity is at most the ratio of the
        two counts), found by bisection in the counts sorted once per plan."""
        if self._memo["counts_sorted"] is None:
            own, counts = self._own["gram_counts"], self._gram_counts
            counted = [(c, fp) for fp, c in own.items() if c is not None]
            uncounted = [fp for fp, c in own.items() if c is None]
            if self._shared is not None:  # sorted once per kernel; less what this plan drops
                counted += [(c, fp) for c, fp in self._shared["counted"]
                            if fp in counts and fp not in own]
                uncounted += [fp for fp in self._shared["uncounted"]
                              if fp in counts and fp not in own]
            counted.sort()
            self._memo["counts_sorted"] = ([c for c, _ in counted], [fp for _, fp in counted],
                                           uncounted)
        counts, fps, uncounted = self._memo["counts_sorted"]
        n = len(shingles(code))
        lo = bisect.bisect_left(counts, SIMILAR * n * (1 - 1e-9))
        hi = bisect.bisect_right(counts, n / SIMILAR * (1 + 1e-9))
        candidates = {fp: self._gram_counts[fp] for fp in fps[lo:hi]}
        candidates.update((fp, None) for fp in uncounted)
        return candidates

    def _clone_of(self, code: types.CodeType, fp: str, qualname: str) -> str | None:
        """The label of the forbidden function ``code`` is a clone of: the same instruction
        stream under the same qualified name, or the very same bytes, constants (docstring
        included) and local and global names under any name — for a short function (under
        ``DISTINCTIVE`` instructions) only when its code claims an installed file, as a clone
        made with ``code.replace`` does: a student's own cell can write fib's three-line loop
        byte for byte. Comprehensions and lambdas
        (``<listcomp>``) are never clones by themselves: a short ``[f(v) for v in xs]`` is the
        same bytes everywhere."""
        if code.co_name.startswith("<"):
            return None
        for e in self._by_clone.get(fp, ()):
            if e["qualname"] == qualname:
                return e["label"]
            if e["size"] < DISTINCTIVE and not _claims_installed(code):
                continue  # a short function written by hand can be byte-identical (fib's loop)
            original = _forbidden_code(self._state, _entry_where(e), fp)
            if original is not None and _exact(original) == _exact(code):
                return e["label"]
        return None

    def _classify(self, code: types.CodeType) -> tuple:
        """(code, kind, label, foreign, student): what the hook does when ``code`` starts.

        ``foreign``: (label, note, stdlib) when ``code`` belongs to a module the exercise's
        allowlist does not permit (refused when the student's code calls it); ``student``:
        whether it is the student's code (the allowlist applies to its calls; the student's
        own code is permitted whatever file it claims).
        """
        # Where it comes from, whether it is the student's and what the allowlist says of it
        # are the same for every guard with this allowlist: kept per kernel (``_classified``).
        known = self._classified.get(id(code))
        if known is not None and known[0] is code:
            where, student, foreign = known[1:]
        else:
            where, student, foreign = _where(code), _is_student(self._state, code), None
            module = None
            if self._allowed is not None and not student and code.co_name not in (
                    "<module>", "__del__"):
                module = _origin(self._state, code)[0]
                if module is not None:
                    foreign = self._foreign_label(module, _qualname(code))
            if student or module is not None or self._allowed is None:  # (else its module
                self._classified[id(code)] = (code, where, student, foreign)  # may come later)
        volatile = foreign is not None and _gc_callback(code)
        if volatile:  # asked at every call (not kept in ``_seen``): the callbacks change
            foreign = None
        label = self._label(code, where, student)
        if self._allowed is None:
            student = False  # (the allowlist's view of it: no allowlist, nothing to check)
        elif student:
            self._students[id(code)] = code  # the hook checks the C functions it calls
            if self._tables is not None:
                self._tables.student.add(id(code))
        if label is not None:
            entry = (code, _FORBIDDEN, label, foreign, student)
        elif id(code) in self._watched_py:
            entry = (code, _TAMPER, self._watched_py[id(code)][1], foreign, student)
        elif self._dispatch_codes.get(id(code)) is code:
            entry = (code, _DISPATCH, None, foreign, student)
        elif code is self._state.get("thread_start") and self._allowed is not None:
            entry = (code, _START, None, foreign, student)
        else:
            entry = (code, None, None, foreign, student)
        if volatile:
            return entry
        self._seen[id(code)] = entry  # holds the code object, so its id is never reused
        if self._tables is not None and entry[1] is None:  # what the native hook may answer
            if foreign is None:
                self._tables.quiet.add(id(code))
            elif foreign[2]:
                self._tables.stdlib.add(id(code))
        return entry

    def _foreign_label(self, module: str, name: str) -> tuple[str, str] | None:
        """(label, note) of a function of ``module`` the allowlist does not permit, else None."""
        permitted = self._permitted.get(module)
        if permitted is None:
            permitted = self._permitted[module] = _permits(self._allowed, module)
        if permitted:
            return None
        top = module.partition(".")[0]
        stdlib = top in _STDLIB
        if stdlib and top in ("concurrent", "multiprocessing", "importlib", "xml", "email"):
            top = ".".join(module.split(".")[:2])
        where = "the standard library's" if stdlib else "the package"
        return (f"`{module}.{name}`",
                f" (while the check runs, your code may use only the standard library's plain "
                f"data modules, numpy, mlsys_lab and what this exercise allows; {where} "
                f"`{top}` is not among them)", stdlib)

    def _violation(self, message: str) -> None:
        """Record a violation (it sticks) and stop the student's code here."""
        if message not in self.violations:
            self.violations.append(message)
        if threading.get_ident() != self._thread:
            # Python drops a profile hook that raises: this thread is not watched any more.
            self._state.get("hooked", {}).pop(threading.get_ident(), None)
        raise OffLimitsError(message)

    def _refuse(self, label: tuple[str, str] | str, tamper: bool = False) -> None:
        if tamper:
            self._violation(f"your code called `{label}`, which switches off the check's watch "
                            f"for off-limits functions; the check cannot trust this result")
        label, note = label
        self._violation(f"this exercise asks you to write {self.task} yourself; {label} is off "
                        f"limits here{note}")

    def _make_hook(self):
        """The profile hook: one object (so ``sys.getprofile() is`` works). The Python hook
        reads its tables from locals, since it runs on every call and return of the probe;
        where ``native_hook`` is available, a native function answers the events that need
        nothing from it and hands it the rest (the hook is then a ``native_hook.Hook``)."""
        me, seen, classify, c_ids, c_names = (self, self._seen, self._classify, self._c_ids,
                                              self._c_funcs)
        closed, students = self._allowed is not None, self._students
        state = self._state

        def handover(frame, event, arg):
            # A thread started during an earlier probe keeps this hook: it answers to the
            # guard that is on now (``seal`` state is shared by every copy of this module).
            active = state.get("active")
            if active is not None and active is not me:
                active.hook(frame, event, arg)

        def hook(frame, event, arg):
            if event == "call":
                if me._closing:
                    return handover(frame, event, arg)
                code = frame.f_code
                entry = seen.get(id(code))
                if entry is None or entry[0] is not code:
                    entry = classify(code)
                if entry[1] is not None:
                    me._on_call(frame, entry)
                elif entry[3] is not None:
                    foreign = entry[3]
                    if foreign[2]:  # the standard library's: refused when the student calls it
                        back = frame.f_back
                        if back is not None and students.get(id(back.f_code)) is back.f_code:
                            me._on_forbidden(foreign[:2])
                    else:  # a package's: the student's code may also be further down
                        me._on_foreign(frame, foreign)
            elif event == "c_call":
                if me._closing:
                    return handover(frame, event, arg)
                hit = c_ids.get(id(arg))
                if hit is not None and hit[0] is arg:
                    me._on_c_id(frame, hit)
                if closed:  # a C function the student's code calls must be allowed
                    code = frame.f_code
                    if students.get(id(code)) is code:
                        me._on_c_call(arg)
                owners = c_names.get(getattr(arg, "__name__", None)) if c_names else None
                if owners is not None:
                    label = _c_label(arg, owners)
                    if label is not None:
                        me._on_forbidden((label, ""))

        def thread_hook(frame, event, arg):
            """The first event of a thread started while a probe runs: note the thread (it is
            watched from now on, by whichever guard is on) and hand it the hook."""
            state.setdefault("hooked", {})[threading.get_ident()] = threading.current_thread()
            if profile is hook:
                sys.setprofile(hook)
            else:
                native_hook.install(native["address"], profile)
            return hook(frame, event, arg)

        self._thread_hook = thread_hook
        profile, native = hook, state.get("native")
        if native is not None:
            profile = native_hook.Hook(hook)
            self._tables = native_hook.Tables(profile)
            self._tables.flag(native_hook.ALL_C, bool(c_names))
            self._tables.flag(native_hook.CLOSED, closed)
        return profile

    def _on_call(self, frame, entry) -> None:
        kind = entry[1]
        if kind == _START:  # ``Thread.start``: note the threads the student's code starts
            if self._student_caller(frame):
                thread = frame.f_locals.get("self")
                if isinstance(thread, threading.Thread):
                    self._state["student_threads"].add(thread)
            if entry[3] is not None:
                self._on_foreign(frame, entry[3])
            return
        if kind == _DISPATCH:
            label = self._dispatcher_label(frame.f_locals.get("self"))
            if label is None:
                return
        else:
            label = entry[2]
        if kind == _TAMPER:
            self._refuse(label, tamper=True)
        self._on_forbidden(label)

    def _on_foreign(self, frame, foreign) -> None:
        """A function of a module the allowlist does not permit starts: refuse it when the
        student's code called it, directly or through the standard library (a callback:
        ``heapq.merge(key=f)``, ``threading.Thread(target=f)`` in a thread the student's code
        started). A permitted package calling it (numpy, mlsys_lab) is not the student's doing,
        nor is the standard library using its own modules."""
        label, note, stdlib_callee = foreign
        state = self._state
        back = frame.f_back
        for depth in range(200):
            if back is None:  # the bottom of a thread's stack: who started the thread?
                if threading.current_thread() in state["student_threads"]:
                    self._on_forbidden((label, note))
                return
            module, student = _origin(state, back.f_code)
            if student:
                self._on_forbidden((label, note))
                return
            if module is None or module.partition(".")[0] not in _STDLIB or module.startswith(
                    _IMPORTING):
                return  # a package's own doing, or the import machinery's (finders, loaders)
            if depth == 0 and stdlib_callee:
                return
            back = back.f_back

    def _on_c_call(self, builtin) -> None:
        """The student's code calls a C function: refuse it when its module is not allowed.

        The verdict is kept per (the owner's class, or the owning module or class itself; the
        name; ``__module__``): ``xs.append`` is a new bound method at every call, and finding
        the class that defines it walks the owner's MRO. The table is keyed by ``id`` and
        checks identity, so no hash or ``==`` of the student's objects runs inside the hook."""
        owner = getattr(builtin, "__self__", None)
        if owner is not None and not issubclass(type(owner), (type, types.ModuleType)):
            owner = type(owner)  # by its real class: an object's ``__class__`` may lie
        name = getattr(builtin, "__name__", None)
        module_attr = getattr(builtin, "__module__", None)
        key = (id(owner), name, id(module_attr)) if type(name) is str else None
        known = self._c_verdicts.get(key) if key is not None else None
        if known is not None and known[0] is owner and known[1] is module_attr:
            foreign = known[2]
        else:
            module = _c_module(builtin)
            foreign = None if module is None else self._foreign_label(
                module, name if type(name) is str else "?")
            if key is not None:  # the entry holds owner and module: their ids stay theirs
                self._c_verdicts[key] = (owner, module_attr, foreign)
        if foreign is not None:
            self._on_forbidden(foreign[:2])
        elif (key is not None and self._tables is not None
              and issubclass(type(builtin), types.BuiltinFunctionType)):
            self._tables.permit_c(builtin)

    def _student_caller(self, frame) -> bool:
        """Whether the function running in ``frame`` was called by the student's code, directly
        or through the standard library."""
        back = frame.f_back
        while back is not None:
            module, student = _origin(self._state, back.f_code)
            if student:
                return True
            if module is None or module.partition(".")[0] not in _STDLIB:
                return False
            back = back.f_back
        return threading.current_thread() in self._state["student_threads"]

    def _on_c_id(self, frame, hit) -> None:
        _, kind, label = hit
        if kind == _SPAWN:
            if frame.f_code is not self._state["thread_start"]:
                self._violation("your code started a thread with `_thread`, which the check "
                                "cannot watch; the check cannot trust this result (use "
                                "`threading.Thread`)")
        elif kind == _TAMPER:
            self._refuse(label, tamper=True)
        else:  # a switched-off Numba entry point, called directly
            self._on_forbidden(label)

    def _on_forbidden(self, label) -> None:
        if self._lifted and threading.get_ident() == self._thread:
            return  # the grader's own ``unguarded()`` in the probe's thread
        self._refuse(label)

    # -- Numba ----------------------------------------------------------------------------

    def _dispatcher_label(self, dispatcher) -> tuple[str, str] | None:
        if dispatcher is None:
            return None
        known = self._dispatchers.get(id(dispatcher))
        if known is not None and known[0] is dispatcher:
            return known[1]
        overloads = getattr(dispatcher, "overloads", None)
        size = len(overloads) if isinstance(overloads, dict) else 0
        known = self._clean.get(id(dispatcher))
        if known is not None and known[0] is dispatcher and known[1] == size:
            return None  # looked at already, with as many overloads: runs no forbidden code
        label = self._dispatcher_label_of(dispatcher)
        if label is None:
            self._clean[id(dispatcher)] = (dispatcher, size)
        return label

    def _dispatcher_label_of(self, dispatcher) -> tuple[str, str] | None:
        codes, names, files = _dispatcher_sources(self._state, dispatcher)
        if files is not None:  # none of it the student's: only a forbidden function's file
            forbidden_files = self._memo["forbidden_files"]
            if forbidden_files is None:  # (the references' files: all of them)
                forbidden_files = self._memo["forbidden_files"] = frozenset(
                    where[0] for table in (self._own["by_where"], self._own["by_synthetic"])
                    for where in table
                ).union(self._shared["files"] if self._shared is not None else ())
            if files.isdisjoint(forbidden_files):
                return None
        for code in codes:
            entry = self._seen.get(id(code))
            if entry is not None and entry[0] is code:
                label = entry[2] if entry[1] == _FORBIDDEN else None
            else:  # only whether it is forbidden: its code runs as Python only when off
                label = self._label(code)
            if label is not None:
                return label
        for module, qualname in names:
            label = self._label_by_name(module, qualname)
            if label is not None:
                return label
        return None

    def _label_by_name(self, module: str, qualname: str) -> tuple[str, str] | None:
        """The label of the forbidden function ``qualname`` of module ``module`` (by the
        module's file), or None (``_dispatcher_sources`` keeps only names that are strings)."""
        path = getattr(sys.modules.get(module), "__file__", None)
        if not isinstance(path, str):
            return None
        by_name = self._memo["by_name"]
        if by_name is None:
            by_name = self._memo["by_name"] = {(file, name): label for (file, _, name), label
                                               in self._by_where.items()}
        label = by_name.get((_realpath(path), qualname))
        return (label, "") if isinstance(label, str) else label

    def _switch_off_dispatchers(self) -> None:
        """Find every compiled dispatcher that runs forbidden code and switch its entries off."""
        mod = sys.modules.get("numba.core.dispatcher")
        if mod is None or not (self._by_where or self._by_synthetic or self._by_fp):
            return
        watch = self._memo["watch"]
        if watch is not None and _still_holds(watch):  # the last probe's findings hold
            self._found, self._off = watch["found"], watch["off"]
            self._dispatch_codes = _dispatch_codes(self._state, mod)
        else:
            if self._found is None:  # once per guard: later copies are caught when they compile
                self._found = _dispatchers(mod)
                self._dispatch_codes = _dispatch_codes(self._state, mod)
                if watch is not None and len(watch["found"]) == len(self._found) and all(
                        map(operator.is_, watch["found"], self._found)):
                    self._off = watch["off"]  # the same dispatchers: compare their counts
            # What to switch off changes only when a dispatcher compiles a new overload.
            counts = tuple(len(d.overloads) if isinstance(getattr(d, "overloads", None), dict)
                           else -1 for d in self._found)
            if self._off is None or self._off[0] != counts:
                self._off = (counts, self._forbidden_dispatchers(mod))
            self._memo["watch"] = _dispatcher_watch(
                self._state["frozen"]["gather"], self._found, self._off, mod)
        self._dispatchers = dict(self._off[1])
        for d, label in self._dispatchers.values():
            if isinstance(d, mod.Dispatcher):
                for cres in d.overloads.values():
                    self._entry_points[id(cres.entry_point)] = (cres.entry_point, label)
                    self._c_ids[id(cres.entry_point)] = (cres.entry_point, _FORBIDDEN, label)
                d._clear()  # calls now fall back into the dispatcher's Python methods

    def _forbidden_dispatchers(self, mod) -> dict[int, tuple[Any, tuple[str, str]]]:
        """The dispatchers among ``self._found`` that run forbidden code, or whose compiled code
        calls one that does: id -> (dispatcher, label)."""
        off: dict[int, tuple[Any, tuple[str, str]]] = {}
        for d in self._found:
            label = self._dispatcher_label(d)
            if label is not None:
                off[id(d)] = (d, label)
        nbtypes = sys.modules["numba.core.types"]
        changed = bool(off)  # nothing switched off: no compiled code can call it
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
        return off

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

    def _running_threads(self) -> list[str]:
        """Threads started since the seal (not the kernel's, nor tqdm's monitor) that are
        running now: before Python 3.12 no profile hook can be given to them."""
        me = threading.get_ident()
        found = []
        for ident in list(sys._current_frames()):
            if ident == me or ident in self._state["threads"]:
                continue
            thread = threading._active.get(ident)
            if self._state.get("hooked", {}).get(ident) is thread is not None:
                continue  # started during a probe: it still has a guard's hook
            if not _kernel_thread(thread):
                found.append(f"`{getattr(thread, 'name', ident)}`")
        return found

    def _start(self) -> None:
        global _ACTIVE
        self.violations = []
        self._lifted = 0
        self._thread = threading.get_ident()
        if not hasattr(threading, "setprofile_all_threads"):  # before Python 3.12
            running = self._running_threads()
            if running:
                self._violation(
                    f"a thread your notebook started before the check is still running "
                    f"({', '.join(running[:3])}); on Python {sys.version_info[0]}."
                    f"{sys.version_info[1]} the check cannot watch it, so it cannot trust this "
                    f"result (join or shut down your threads and pools before the check)")
        self._entry_points = {}
        self._c_ids.clear()
        self._c_ids.update(self._c_static)
        self._switch_off_dispatchers()
        dispatch = self._dispatch_codes or None
        if self._memo["dispatch"] is not dispatch:  # what ``_classify`` calls a dispatcher's
            self._forget()  # method changed (Numba was imported since): classify again
            self._memo["dispatch"] = dispatch
        self._previous = (sys.getprofile(), getattr(threading, "_profile_hook", None))
        _ACTIVE = self
        self._state["active"] = self
        tables = self._tables
        watched = frozenset(self._c_ids)
        if tables is not None and watched != self._published_c_ids:
            tables.c_ids.clear()  # the native hook's table: the C functions watched by identity
            for key in watched:
                tables.c_ids.add(key)
            self._published_c_ids = watched
        if hasattr(threading, "setprofile_all_threads"):  # Python 3.12+: running threads too
            if tables is None:
                threading.setprofile_all_threads(self.hook)
            else:  # threads started later get the Hook object: its Python hook
                threading.setprofile(self.hook)
                native_hook.install_all_threads(self._state["native"]["address"], self.hook)
        else:
            threading.setprofile(self._thread_hook)
            if tables is None:
                sys.setprofile(self.hook)
            else:
                native_hook.install(self._state["native"]["address"], self.hook)
        self._closing = False
        if tables is not None:
            tables.flag(native_hook.CLOSING, False)

    def _stop(self) -> None:
        global _ACTIVE
        self._closing = True
        if self._tables is not None:
            self._tables.flag(native_hook.CLOSING, True)
        current = sys.getprofile()
        new_threads = getattr(threading, "_profile_hook", None)
        expected = (self.hook if hasattr(threading, "setprofile_all_threads")
                    else self._thread_hook)
        if not self.violations and (current is not self.hook or new_threads is not expected):
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
        if self._state.get("active") is self:
            self._state["active"] = None
        _ACTIVE = None
        if self._tables is not None:
            self._memo["native"] = self._tables.saved()

    def _forget(self) -> None:
        """Drop the verdicts on code kept for this plan (``_memo``), before the hook is on."""
        self._seen.clear()
        self._students.clear()
        self._memo["native"] = None
        if self._tables is not None:
            for table in (self._tables.quiet, self._tables.stdlib, self._tables.student):
                table.clear()


def _gc_callback(code: types.CodeType) -> bool:
    """True for the code of a function in ``gc.callbacks``: the collector calls it from whatever
    frame allocated when a collection began (student code, say), but nobody there called it
    (hypothesis, for one, registers such a callback)."""
    return any(getattr(cb, "__code__", None) is code for cb in gc.callbacks)


def _dispatcher_sources(state: dict, dispatcher) -> tuple[list, list, frozenset | None]:
    """What a Numba dispatcher was made from: (code objects, (module, qualified name) of each
    overload's function descriptor, the real paths of the files all of them come from, or None
    when one is the student's code or its file is unknown). Plan-independent, so kept per
    kernel, looked at again when what it is read from changed: ``py_func``, the overloads, the
    seal's record of the dispatcher, ``func_code``."""
    py_func = getattr(dispatcher, "py_func", None)
    overloads = getattr(dispatcher, "overloads", None)
    compiled = list(overloads.values()) if isinstance(overloads, dict) else []
    sealed = state["kernels"].get(id(dispatcher))
    # The code Numba made the dispatcher from, which it keeps beside ``py_func``.
    func_code = getattr(dispatcher, "__dict__", {}).get("func_code")
    read = (py_func, sealed, func_code, *compiled)
    cache = state.setdefault("dispatcher_sources", {})
    known = cache.get(id(dispatcher))
    if (known is not None and known[0] is dispatcher and len(known[1]) == len(read)
            and all(map(operator.is_, known[1], read))):
        return known[2:]
    codes = [getattr(py_func, "__code__", None)]
    if sealed is not None and sealed[0] is dispatcher:  # its py_func when the seal was taken
        codes.append(sealed[1])
    codes.append(func_code)
    # What the overloads were compiled from: a swapped ``py_func`` does not change them.
    for cres in compiled:
        func_id = getattr(getattr(cres, "type_annotation", None), "func_id", None)
        codes.append(getattr(func_id, "code", None))
    codes = [c for c in codes if isinstance(c, types.CodeType)]
    # An overload loaded from Numba's disk cache has its annotation as text; its function
    # descriptor still names the module and function it was compiled from.
    names = []
    for cres in compiled:
        described = getattr(cres, "fndesc", None)
        module, qualname = (getattr(described, "modname", None),
                            getattr(described, "qualname", None))
        if isinstance(module, str) and isinstance(qualname, str):
            names.append((module, qualname))
    files: set[str] | None = set()
    for code in codes:
        if _is_student(state, code):
            files = None
            break
        files.add(_where(code)[0])
    for module, _ in names if files is not None else ():
        path = getattr(sys.modules.get(module), "__file__", None)
        if not isinstance(path, str):
            files = None
            break
        files.add(_realpath(path))
    sources = (codes, names, frozenset(files) if files is not None else None)
    cache[id(dispatcher)] = (dispatcher, read, *sources)  # holds what it read: ids stay theirs
    return sources


def _dispatchers(mod: types.ModuleType) -> list:
    """Every Numba dispatcher alive. Each registers a ``weakref.finalize`` when it is made, so
    the finalizers' registry lists them all at a fraction of a scan of every object; without
    that registry, instances of the dispatcher classes are found through the collector (they
    refer to their class)."""
    kinds = _subclasses(mod._DispatcherBase)
    registry = getattr(weakref.finalize, "_registry", None)
    if isinstance(registry, dict):
        found = []
        for info in list(registry.values()):
            ref = getattr(info, "weakref", None)
            obj = ref() if isinstance(ref, weakref.ref) else None
            if type(obj) in kinds:
                found.append(obj)
        return found
    return [o for o in gc.get_referrers(*kinds) if type(o) in kinds]


def _dispatch_codes(state: dict, mod: types.ModuleType) -> dict[int, types.CodeType]:
    """The code of the methods of Numba's dispatcher classes, by id: once per kernel (again
    when the CUDA dispatcher was imported since)."""
    classes = mod.Dispatcher.__mro__ + _cuda_dispatcher_classes()
    known = state.get("dispatch_codes")
    if known is not None and known[0] == classes:
        return known[1]
    codes = {}
    for cls in classes:
        if cls.__module__.startswith("numba"):
            for member in vars(cls).values():
                fn = _unwrap(member)
                if isinstance(fn, types.FunctionType):
                    codes[id(fn.__code__)] = fn.__code__
    state["dispatch_codes"] = (classes, codes)
    return codes


def _dispatcher_watch(gather, found: list, off: tuple[tuple, dict], mod) -> dict | None:
    """What the guard found among Numba's dispatchers (``found``, and ``off``: their overload
    counts and what to switch off), with the words that say whether it still holds
    (``_still_holds``), read in one native call (``native_hook.gatherer``): the version of
    ``weakref.finalize``'s registry (every dispatcher registers a finalizer when it is made,
    and is dropped from it when it dies) and, for each dispatcher that is not switched off, the
    versions of its namespace (``py_func`` swapped, ``overloads`` replaced) and of its
    overloads (a new one compiled). The switched-off ones stay off whatever they compile; their
    entry points are read at every start. A namespace is read through the descriptor of
    Numba's base class (C: a subclass's ``__dict__`` property is not run); without the native
    reader, or where a namespace or overloads are not plain dicts, there is no watch (None)
    and the guard counts overloads at every start. Plain data, as the seal's record is
    (``_frozen``): the function that reads it is the reading guard's own."""
    registry = getattr(weakref.finalize, "_registry", None)
    namespace = _CLASS_DICT(mod._DispatcherBase).get("__dict__")
    if (gather is None or type(registry) is not dict
            or type(namespace) is not types.GetSetDescriptorType):
        return None
    import ctypes
    dicts = [registry]
    for d in found:
        if id(d) in off[1]:
            continue
        try:
            space = namespace.__get__(d)
        except TypeError:
            return None
        overloads = space.get("overloads") if type(space) is dict else None
        if not isinstance(overloads, dict):
            return None
        dicts += [space, overloads]
    at = 8 * native_hook.WORD_LAYOUT["dict_version"]
    n = len(dicts)
    addresses = (ctypes.c_int64 * n)(*(id(x) + at for x in dicts))
    now = (ctypes.c_int64 * n)()
    gather(addresses, now, n)
    return {"found": found, "off": off, "gather": gather, "addresses": addresses, "now": now,
            "words": bytes(now), "held": dicts}  # held: their addresses stay theirs


def _still_holds(watch: dict) -> bool:
    """Whether what ``_dispatcher_watch`` recorded still holds: none of its words changed."""
    watch["gather"](watch["addresses"], watch["now"], len(watch["now"]))
    return bytes(watch["now"]) == watch["words"]


def _subclasses(cls: type) -> set[type]:
    """``cls`` and every class derived from it, now."""
    found, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c not in found:
            found.add(c)
            todo.extend(type.__subclasses__(c))
    return found


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


#: Packages whose own threads (their classes, or ``Thread``s running their methods) start after
#: the seal: the kernel's output pipes and zmq's garbage collector, tqdm's monitor.
_KERNEL_PACKAGES = ("ipykernel", "zmq", "IPython", "jupyter_client", "tqdm")


def _kernel_thread(thread: Any) -> bool:
    """Whether a running thread is the kernel's (or tqdm's), not one the notebook started."""
    def ours(kind: type) -> bool:
        return getattr(kind, "__module__", "").partition(".")[0] in _KERNEL_PACKAGES

    kind = type(thread)
    if ours(kind):
        return True
    target = getattr(thread, "_target", None)
    owner = getattr(target, "__self__", None)
    return kind is threading.Thread and owner is not None and ours(type(owner))


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
