"""The guard's native profile hook (``mlsys_lab.grading.core.native_hook``).

The native function may answer an event itself only when the guard's Python hook would do
nothing with it. These tests install it with a Python side that records what it is handed, and
check, table by table, which events reach Python: a hook that answered too much (a table lookup
that matches what it should not, a flag ignored) lets a call the guard must see go unseen, and
fails here; one that answers too little only costs time, and fails
``test_a_quiet_call_and_a_returning_one_never_reach_python``. The guard's own tests (the cheats of
``test_grading_integrity`` and ``test_grading_closed_probe``) run on the native hook wherever
it builds; some run on the Python hook alone as well (``hook_kind``).
"""

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.grading.core import guard
from mlsys_lab.grading.core import native_hook as nh
from mlsys_lab.grading.core.wire import OffLimitsError


def test_the_native_hook_builds_on_this_interpreter():
    """CI's CPython (x86-64, with the GIL) is one where it must build: a failure here means the
    guard silently fell back to its slower Python hook."""
    assert nh._layout_holds()
    built = nh.build()
    assert built is not None, nh._BUILT.get("error")
    assert built["address"] and built is nh.build()  # compiled once per process


def _routed(setup, run, python=None):
    """Run ``run()`` under a native hook prepared by ``setup(tables)``; return the events handed
    to Python as (event, code or C function), without the ``setprofile`` that ends it."""
    handed = []

    def record(frame, event, arg):
        handed.append((event, frame.f_code if event == "call" else arg))
        if python is not None:
            python(frame, event, arg)

    hook = nh.Hook(record)
    tables = nh.Tables(hook)
    setup(tables)
    tables.flag(nh.CLOSING, False)
    nh.install(nh.build()["address"], hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return [(event, what) for event, what in handed
            if getattr(what, "__name__", None) != "setprofile"]


def _callee(x):
    return x


def _other(x):
    return x


def _student_fn(f, x):
    return f(x)


def _library_fn(f, x):
    return f(x)


def test_a_quiet_call_and_a_returning_one_never_reach_python():
    def setup(t):
        t.quiet.add(id(_callee.__code__))

    handed = _routed(setup, lambda: (_callee(1), _other(2)))
    codes = [what for event, what in handed if event == "call"]
    assert _other.__code__ in codes and _callee.__code__ not in codes
    assert {event for event, _ in handed} <= {"call", "c_call"}  # returns never


def test_closing_hands_every_call_to_python():
    def setup(t):
        t.quiet.add(id(_callee.__code__))
        t.flag(nh.CLOSING, True)

    hook = nh.Hook(lambda *a: None)
    handed = []
    hook.python = lambda frame, event, arg: handed.append(frame.f_code if event == "call" else arg)
    tables = nh.Tables(hook)
    setup(tables)
    hook.control[nh.PYTHON] = id(hook.python)
    nh.install(nh.build()["address"], hook)
    try:
        _callee(1)
        len(())
    finally:
        sys.setprofile(None)
    assert _callee.__code__ in handed and len in handed


def test_a_standard_library_callee_reaches_python_only_from_the_students_code():
    """``stdlib`` lists functions the allowlist refuses only when the student's code calls them
    directly: the native hook looks at the calling frame's code."""
    def setup(t):
        t.stdlib.add(id(_callee.__code__))
        t.student.add(id(_student_fn.__code__))
        t.quiet.add(id(_student_fn.__code__))
        t.quiet.add(id(_library_fn.__code__))

    handed = _routed(setup, lambda: (_student_fn(_callee, 1), _library_fn(_callee, 2)))
    assert handed.count(("call", _callee.__code__)) == 1  # the student's call only


def _calls_len(x):
    return len(x)


def _appends(xs):
    xs.append(1)


def test_c_calls_reach_python_from_the_students_code_until_permitted():
    def closed(t, permit=()):
        t.flag(nh.CLOSED, True)
        t.student.add(id(_calls_len.__code__))
        t.student.add(id(_appends.__code__))
        for builtin in permit:
            t.permit_c(builtin)

    def run():
        _calls_len(())
        _library_fn(len, ())

    assert _routed(closed, run).count(("c_call", len)) == 1  # the student's, not the library's
    assert ("c_call", len) not in _routed(lambda t: closed(t, [len]), run)
    # not closed: C calls are the allowlist's business only in a closed probe
    assert ("c_call", len) not in _routed(lambda t: t.student.add(id(_calls_len.__code__)), run)


def test_a_permitted_method_is_kept_per_owner_class():
    """``xs.append`` is a new object at every call: the verdict is kept by (method definition,
    the owner's class, module). Another list's ``append`` is answered natively; a subclass's,
    or ``bytearray.append`` (another definition), reaches Python."""
    class Mine(list):
        pass

    def setup(t):
        t.flag(nh.CLOSED, True)
        t.student.add(id(_appends.__code__))
        t.permit_c([].append)

    for xs, reaches in (([], False), (Mine(), True), (bytearray(), True)):
        handed = _routed(setup, lambda xs=xs: _appends(xs))
        assert any(event == "c_call" and what.__name__ == "append"
                   for event, what in handed) is reaches, type(xs)


def test_watched_c_functions_and_forbidden_names_always_reach_python():
    for setup in (lambda t: t.c_ids.add(id(len)), lambda t: t.flag(nh.ALL_C, True)):
        handed = _routed(setup, lambda: _library_fn(len, ()))
        assert ("c_call", len) in handed


def test_an_error_from_python_reaches_the_probed_code_and_the_hook_stays():
    def refuse(frame, event, arg):
        if event == "call" and frame.f_code is _other.__code__:
            raise OffLimitsError("refused")

    hook = nh.Hook(refuse)
    nh.Tables(hook).flag(nh.CLOSING, False)
    nh.install(nh.build()["address"], hook)
    try:
        assert _callee(3) == 3
        with pytest.raises(OffLimitsError, match="refused"):
            _other(4)
        still = sys.getprofile() is hook
    finally:
        sys.setprofile(None)
    assert still  # unlike a Python hook that raises, the native one is not dropped


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 2 ** 40), min_size=1, max_size=300, unique=True),
       st.sampled_from([1, 3]))
def test_a_table_lists_exactly_what_was_added(keys, width):
    """Open addressing with growth, against a Python set, read the way the native lookup reads
    it (from the control block's address and mask)."""
    import ctypes

    import numpy as np

    control = np.zeros(nh.WORDS, np.int64)
    table = nh._Table(control, nh.QUIET, width)
    rows = [tuple(16 * k + j for j in range(width)) for k in keys]
    for row in rows[::2]:
        table.add(row)
    size = int(control[nh.QUIET + 1]) + 1
    words = (ctypes.c_int64 * (size * width)).from_address(int(control[nh.QUIET]))

    def listed(row):
        i = nh._hash(row) & (size - 1)
        while True:
            found = tuple(words[i * width:(i + 1) * width])
            if found == row:
                return True
            if found[0] == 0:
                return False
            i = (i + 1) & (size - 1)

    assert [listed(r) for r in rows] == [k % 2 == 0 for k in range(len(rows))]
    assert table.count == len(rows[::2]) <= size // 2


def test_thousands_of_codes_are_looked_up_natively():
    """The native lookup over a grown table: of 4,000 functions, exactly the 2,000 not listed
    reach Python."""
    functions = [eval(f"lambda: {k}") for k in range(4000)]

    def setup(t):
        for f in functions[::2]:
            t.quiet.add(id(f.__code__))

    def run():
        for f in functions:
            f()

    handed = {what for event, what in _routed(setup, run) if event == "call"}
    assert handed >= {f.__code__ for f in functions[1::2]}
    assert not handed & {f.__code__ for f in functions[::2]}


def test_the_guard_uses_the_native_hook_where_the_seal_built_it(monkeypatch):
    from mlsys_lab.grading.core import exercise

    plan = guard.plan_for(exercise.get_exercise("4.1"))
    state = guard.seal()
    assert isinstance(guard.Guard(plan, state).hook, nh.Hook)
    monkeypatch.setitem(state, "native", None)
    assert not isinstance(guard.Guard(plan, state).hook, nh.Hook)


def test_python_only_when_asked(monkeypatch):
    """``MLSYS_LAB_GUARD_HOOK=python`` (read when the hook would first be built) keeps the
    guard on its Python hook."""
    monkeypatch.setenv("MLSYS_LAB_GUARD_HOOK", "python")
    assert not nh._wanted()
