"""Exercises of chapters 7 and 8 test the idea: shortcuts and wrong ideas score 0 on its cases.

Every cheat listed in issue 10 for these chapters, and each wrong idea found in the audit (the
"Wrong ideas rejected" of each exercise module in ``mlsys_lab/grading/exercises/ch07_*/`` and
``ch08_*/``), is checked here in process with ``run_cases``, which makes the same probe -> wire
-> judge round trip as the grader. The reference answers (copies of the solution notebooks'
code) must score full marks.
"""

from __future__ import annotations

import inspect
import math
import struct
import textwrap

import numpy as np
import pytest
from numba import cuda, float32, njit

import mlsys_lab as ml
from mlsys_lab.engine import memory
from mlsys_lab.engine.passes import Rewriter
from mlsys_lab.engine.passes import backend as passes_backend
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.exercises.ch07_compiler_backend_runtime import ex7_1_planner as planner
from mlsys_lab.grading.exercises.ch07_compiler_backend_runtime import ex7_3_scheduler as scheduler
from mlsys_lab.grading.exercises.ch07_compiler_backend_runtime import ex7_4_fp8 as fp8
from mlsys_lab.grading.exercises.ch08_hardware_accelerators import common as ch08_common
from mlsys_lab.grading.exercises.ch08_hardware_accelerators import ex8_1_tiled_matmul as tiled
from mlsys_lab.grading.exercises.ch08_hardware_accelerators import ex8_2_shared_memory as smem


def _rows(result):
    return {row.name: row for row in result.rows}


def _feedback(result):
    return " | ".join(f"{row.name}: {row.feedback}" for row in result.rows if not row.passed)


def _assert_zero(result, cases=None):
    """The named cases (default: all) scored 0."""
    rows = _rows(result)
    names = cases if cases is not None else list(rows)
    for name in names:
        assert rows[name].points == 0, f"{name} passed: {_feedback(result)}"


def _refused(result):
    return all("off limits" in row.feedback for row in result.rows)




# ============================================================================= 7.1 planner


def greedy_by_size(lifetimes):
    order = sorted(lifetimes, key=lambda r: (-r.size, r.start, r.end))
    placed, offsets = [], {}
    for rec in order:
        busy = sorted((off, off + other.size) for other, off in placed
                      if other.overlaps(rec) and other.size > 0)
        offset = 0
        for lo, hi in busy:
            if offset + rec.size <= lo:
                break
            offset = max(offset, hi)
        offsets[rec.id] = offset
        placed.append((rec, offset))
    return offsets


def _lowest_fit_in(order, overlaps=lambda a, b: a.overlaps(b)):
    placed, offsets = [], {}
    for rec in order:
        offset = 0
        for lo, hi in sorted((o, o + r.size) for r, o in placed if overlaps(r, rec)):
            if offset + rec.size <= lo:
                break
            offset = max(offset, hi)
        offsets[rec.id] = offset
        placed.append((rec, offset))
    return offsets


def no_reuse(lifetimes):
    offsets, top = {}, 0
    for r in lifetimes:
        offsets[r.id] = top
        top += r.size
    return offsets


def first_fit_by_start(lifetimes):
    return _lowest_fit_in(sorted(lifetimes, key=lambda r: (r.start, -r.size)))


def smallest_first(lifetimes):
    return _lowest_fit_in(sorted(lifetimes, key=lambda r: r.size))


def end_exclusive(lifetimes):
    """Biggest first, but tensors that meet at one step are taken as disjoint (end exclusive)."""
    return _lowest_fit_in(sorted(lifetimes, key=lambda r: -r.size),
                          overlaps=lambda a, b: a.start < b.end and b.start < a.end)


MIB = 1 << 20
BOOK_ANSWER = [0, 4 * MIB, 6 * MIB, 9 * MIB, 0, 6 * MIB, 4 * MIB]  # the unperturbed example


def hard_coded_book(lifetimes):
    """Returns the chapter's 7-tensor plan by position, and no reuse for anything else."""
    if len(lifetimes) == 7:
        return {r.id: off for r, off in zip(lifetimes, BOOK_ANSWER)}
    return no_reuse(lifetimes)


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_7_1_reference_answer_scores_full_marks(seed):
    result = run_cases("7.1", greedy_by_size, seed=seed)
    assert result.score == result.max == 8, _feedback(result)


@pytest.mark.parametrize("cheat", [
    lambda recs: memory.plan(recs, "greedy_by_size", alignment=1).offsets,
    lambda recs: memory.greedy_by_size(recs),
    lambda recs: memory.STRATEGIES["greedy_by_size"](recs),
    lambda recs: memory.plan(recs, "best", alignment=1).offsets,
], ids=["plan(greedy_by_size)", "greedy_by_size", "STRATEGIES", "plan(best)"])
def test_7_1_library_planner_is_refused(cheat):
    result = run_cases("7.1", cheat, seed=3)
    assert result.score == 0 and _refused(result), _feedback(result)


def test_7_1_a_no_reuse_plan_earns_no_validity_points():
    result = run_cases("7.1", no_reuse, seed=4)
    assert result.score == 0, _feedback(result)
    assert "barely reuse memory" in _rows(result)[
        "40 random sets: no two live tensors overlap, memory is reused"].feedback


def test_7_1_the_chapter_example_cannot_be_hard_coded():
    recs_a, unit_a = planner._book_lifetimes(1)
    recs_b, unit_b = planner._book_lifetimes(2)
    assert unit_a != unit_b and {r.id for r in recs_a} != {r.id for r in recs_b}
    result = run_cases("7.1", hard_coded_book, seed=5)
    assert result.score == 0, _feedback(result)


@pytest.mark.parametrize("wrong", [first_fit_by_start, smallest_first],
                         ids=["first fit by birth", "smallest first"])
def test_7_1_other_placement_orders_fail_the_greedy_case(wrong):
    result = run_cases("7.1", wrong, seed=6)
    rows = _rows(result)
    assert rows["40 random sets: no two live tensors overlap, memory is reused"].passed
    _assert_zero(result, ["distinct sizes: exactly the greedy-by-size offsets"])


def test_7_1_an_end_exclusive_overlap_test_gives_invalid_plans():
    result = run_cases("7.1", end_exclusive, seed=7)
    _assert_zero(result, ["40 random sets: no two live tensors overlap, memory is reused",
                          "distinct sizes: exactly the greedy-by-size offsets"])
    assert "overlap" in _feedback(result)


# ============================================================================= 7.2 transposes


def cancel_transpose_pairs(graph):
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op != "transpose":
            rw.copy(n)
            continue
        x, perm = rw[n.inputs[0]], tuple(n.attrs["axes"])
        inner = rw.producer.get(id(x))
        if inner is not None and inner.op == "transpose":
            perm = tuple(inner.attrs["axes"][i] for i in perm)
            x = inner.inputs[0]
        elif perm != tuple(range(len(perm))):
            rw.copy(n)
            continue
        rw.drop(n)
        if perm == tuple(range(len(perm))):
            rw.bind(n.output, x)
        else:
            rw.bind(n.output, rw.emit("transpose", [x], {"axes": perm}, name=n.output.name))
    return rw.build()


def _pairs_only(graph, compose_wrong=False, pairs_only=False):
    rw = Rewriter(graph)
    for n in graph.nodes:
        inner = rw.producer.get(id(rw[n.inputs[0]])) if n.op == "transpose" else None
        if inner is None or inner.op != "transpose":
            rw.copy(n)
            continue
        p, q = tuple(inner.attrs["axes"]), tuple(n.attrs["axes"])
        perm = tuple(q[i] for i in p) if compose_wrong else tuple(p[i] for i in q)
        if pairs_only and perm != tuple(range(len(perm))):
            rw.copy(n)
            continue
        rw.drop(n)
        x = inner.inputs[0]
        rw.bind(n.output, x if perm == tuple(range(len(perm))) else
                rw.emit("transpose", [x], {"axes": perm}, name=n.output.name))
    return rw.build()


def _pasted_library_pass():
    """The package's cancel_transposes pasted into a cell: renamed, docstring rewritten."""
    fn = passes_backend.cancel_transposes.fn
    source = textwrap.dedent(inspect.getsource(fn))
    source = "\n".join(line for line in source.splitlines() if not line.startswith("@"))
    source = source.replace(fn.__doc__, "My own pass.")
    source = source.replace("def cancel_transposes(", "def mine(")
    scope = dict(vars(passes_backend))
    exec(compile("\n\n" + source, "<pasted cell>", "exec"), scope)
    return scope["mine"]


@pytest.mark.parametrize("seed", [0, 29919])
def test_7_2_reference_answer_scores_full_marks(seed):
    result = run_cases("7.2", cancel_transpose_pairs, seed=seed)
    assert result.score == result.max == 9, _feedback(result)


@pytest.mark.parametrize("cheat", [
    lambda g: passes_backend.cancel_transposes(g),
    lambda g: ml.engine.passes.cancel_transposes.fn(g),
    lambda g: passes_backend.layout_transform(g, to="NCHW"),
    _pasted_library_pass(),
], ids=["cancel_transposes", "its .fn", "layout_transform", "pasted source"])
def test_7_2_library_pass_is_refused(cheat):
    result = run_cases("7.2", cheat, seed=1)
    assert result.score == 0 and _refused(result), _feedback(result)


def test_7_2_cancelling_only_inverse_pairs_fails_the_composition_cases():
    result = run_cases("7.2", lambda g: _pairs_only(g, pairs_only=True), seed=2)
    _assert_zero(result, ["a chain becomes one transpose with the composed axes",
                          "25 random graphs: pure, same outputs, fewest transposes"])


def test_7_2_composing_in_the_wrong_order_changes_the_result():
    result = run_cases("7.2", lambda g: _pairs_only(g, compose_wrong=True), seed=3)
    _assert_zero(result, ["a chain becomes one transpose with the composed axes"])
    assert "changed" in _feedback(result)


def test_7_2_returning_the_input_graph_scores_zero():
    result = run_cases("7.2", lambda g: g, seed=4)
    assert result.score == 0, _feedback(result)


# ============================================================================= 7.3 scheduler


def _levels(graph, cost):
    preds = {n.id: {v.producer.id for v in n.inputs if v.producer is not None} for n in graph.nodes}
    succs = {n.id: [] for n in graph.nodes}
    for nid, ps in preds.items():
        for p in ps:
            succs[p].append(nid)
    level = {}
    for n in reversed(graph.nodes):
        level[n.id] = cost[n.id] + max((level[s] for s in succs[n.id]), default=0.0)
    return preds, succs, level


def schedule(graph, workers, cost):
    """The solution: event-driven list scheduling, highest bottom level first."""
    return _event_schedule(graph, workers, cost, None)


def _event_schedule(graph, workers, cost, key):
    preds, _, level = _levels(graph, cost)
    free, result = [0.0] * workers, {}
    while len(result) < len(graph.nodes):
        w = min(range(workers), key=lambda k: free[k])
        now = free[w]
        ready = [i for i in preds if i not in result
                 and all(p in result and result[p][2] <= now for p in preds[i])]
        if not ready:
            free[w] = min(end for _, _, end in result.values() if end > now)
            continue
        nid = (max(ready, key=lambda i: (level[i], -i)) if key is None
               else min(ready, key=lambda i: key(i, cost)))
        result[nid] = (w, now, now + cost[nid])
        free[w] = now + cost[nid]
    return result


def _static_schedule(graph, workers, cost, priority):
    """Dispatch in list order once a node's inputs are *dispatched* (not finished): the
    solution before this issue, with or without a priority."""
    preds, succs, level = _levels(graph, cost)
    waiting = {nid: len(ps) for nid, ps in preds.items()}
    ready = [nid for nid, k in waiting.items() if k == 0]
    free, result = [0.0] * workers, {}
    while ready:
        if priority:
            ready.sort(key=lambda i: (-level[i], i))
        nid = ready.pop(0)
        w = min(range(workers), key=lambda k: free[k])
        start = max([free[w]] + [result[p][2] for p in preds[nid]])
        result[nid] = (w, start, start + cost[nid])
        free[w] = start + cost[nid]
        for s in succs[nid]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    return result


def serial(graph, workers, cost):
    t, result = 0.0, {}
    for n in graph.nodes:
        result[n.id] = (0, t, t + cost[n.id])
        t += cost[n.id]
    return result


NO_PRIORITY = {
    "FIFO (the issue's cheat)": lambda g, w, c: _static_schedule(g, w, c, priority=False),
    "FIFO, simulated in time": lambda g, w, c: _event_schedule(g, w, c, lambda i, c: i),
    "LIFO": lambda g, w, c: _event_schedule(g, w, c, lambda i, c: -i),
    "costliest node first": lambda g, w, c: _event_schedule(g, w, c, lambda i, c: (-c[i], i)),
    "bottom level, but not simulated in time": lambda g, w, c: _static_schedule(g, w, c, True),
}
CRITICAL = "the critical path first (FIFO order is >= 1.5x slower here)"


@pytest.mark.parametrize("seed", [0, 1, 99])
def test_7_3_reference_answer_scores_full_marks(seed):
    result = run_cases("7.3", schedule, seed=seed)
    assert result.score == result.max == 7, _feedback(result)


@pytest.mark.parametrize("how", list(NO_PRIORITY))
def test_7_3_a_scheduler_without_the_bottom_level_priority_fails_the_critical_path(how):
    result = run_cases("7.3", NO_PRIORITY[how], seed=8)
    _assert_zero(result, [CRITICAL])


def test_7_3_fifo_is_at_least_1_5x_slower_on_every_critical_path_graph():
    for seed in range(0, 400, 37):
        for graph, workers, cost, what in scheduler._critical_cases(seed):
            best = scheduler._makespan(scheduler._list_schedule(graph, workers, cost))
            assert scheduler._makespan(schedule(graph, workers, cost)) == pytest.approx(best)
            if "traced last" in what:
                fifo = NO_PRIORITY["FIFO (the issue's cheat)"](graph, workers, cost)
                assert scheduler._makespan(fifo) >= 1.5 * best, what


def test_7_3_running_everything_on_one_worker_scores_one_point():
    result = run_cases("7.3", serial, seed=9)
    assert result.score == 1 and _rows(result)["one worker never idles"].passed, _feedback(result)


# ============================================================================= 7.4 fp8


def decode_fp8(bits, exp_bits, bias):
    m_bits = 7 - exp_bits
    s, e, m = bits >> 7, (bits >> m_bits) & ((1 << exp_bits) - 1), bits & ((1 << m_bits) - 1)
    sign = -1.0 if s else 1.0
    if e == (1 << exp_bits) - 1:
        return sign * float("inf") if m == 0 else float("nan")
    if e == 0:
        return sign * 2.0 ** (1 - bias) * (m / 2 ** m_bits)
    return sign * 2.0 ** (e - bias) * (1 + m / 2 ** m_bits)


def float16_top_byte(bits, exp_bits, bias):
    """numpy's float16: an 8-bit pattern as the top byte of a half, rescaled for the bias."""
    half = np.array([bits << 8], np.uint16).view(np.float16)[0]
    return float(half) * 2.0 ** (15 - bias)


def float16_by_struct(bits, exp_bits, bias):
    return struct.unpack("<e", (bits << 8).to_bytes(2, "little"))[0] * 2.0 ** (15 - bias)


def float16_rebiased(bits, exp_bits, bias):
    """Move the fields into a half's bit positions and let numpy's float16 decode them."""
    m_bits = 7 - exp_bits
    s, e, m = bits >> 7, (bits >> m_bits) & ((1 << exp_bits) - 1), bits & ((1 << m_bits) - 1)
    half = np.uint16((s << 15) | ((e - bias + 15) & 0x1F) << 10 | m << (10 - m_bits))
    return float(half.view(np.float16))


def normal_formula_everywhere(bits, exp_bits, bias):
    m_bits = 7 - exp_bits
    e, m = (bits >> m_bits) & ((1 << exp_bits) - 1), bits & ((1 << m_bits) - 1)
    return (-1.0 if bits >> 7 else 1.0) * 2.0 ** (e - bias) * (1 + m / 2 ** m_bits)


def subnormal_exponent_off_by_one(bits, exp_bits, bias):
    value = decode_fp8(bits, exp_bits, bias)
    e = (bits >> (7 - exp_bits)) & ((1 << exp_bits) - 1)
    return value / 2 if e == 0 else value


ALL_PATTERNS = "all 256 patterns of E2M5 .. E6M1 with random biases"
SPECIALS = "zeros, subnormals, infinities and NaN"


@pytest.mark.parametrize("seed", [0, 5])
def test_7_4_reference_answer_scores_full_marks(seed):
    result = run_cases("7.4", decode_fp8, seed=seed)
    assert result.score == result.max == 5, _feedback(result)


@pytest.mark.parametrize("cheat", [float16_top_byte, float16_by_struct, float16_rebiased],
                         ids=["ndarray.view float16", "struct 'e'", "rebiased into a float16"])
def test_7_4_numpy_float16_cannot_decode_these_formats(cheat):
    result = run_cases("7.4", cheat, seed=10)
    assert result.score == 0, _feedback(result)


def test_7_4_the_formats_are_unknown_to_numpy_and_vary_by_seed():
    known = {(4, 7), (4, 8), (4, 11), (5, 15), (5, 16), (3, 3)}  # numpy float16 / ml_dtypes float8
    for seed in range(50):
        formats = fp8._format_biases(seed)
        assert {e for e, _ in formats} == {2, 3, 4, 5, 6}
        assert not set(formats) & {(4, 7), (4, 8), (5, 15), (5, 16), (3, 3)}
    assert fp8._format_biases(0) != fp8._format_biases(1)
    assert not set(fp8.NORMAL_FORMATS + fp8.SPECIAL_FORMATS) & known


@pytest.mark.parametrize("wrong", [normal_formula_everywhere, subnormal_exponent_off_by_one])
def test_7_4_wrong_rules_for_the_edge_exponents_fail(wrong):
    result = run_cases("7.4", wrong, seed=11)
    _assert_zero(result, [SPECIALS, ALL_PATTERNS])


# ============================================================================= 8.1 tiled matmul

TILE = 64


@njit(cache=False)
def matmul_tiled_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for i0 in range(0, m, TILE):
        for p0 in range(0, k, TILE):
            for j0 in range(0, n, TILE):
                j1 = min(j0 + TILE, n)
                for i in range(i0, min(i0 + TILE, m)):
                    c_row = c[i, j0:j1]
                    for p in range(p0, min(p0 + TILE, k)):
                        a_ip = a[i, p]
                        b_row = b[p, j0:j1]
                        for j in range(c_row.shape[0]):
                            c_row[j] += a_ip * b_row[j]


@njit(cache=False)
def ikj_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for p in range(k):
            for j in range(n):
                c[i, j] += a[i, p] * b[p, j]


@njit(cache=False)
def blocked_ijk_kernel(a, b, c):
    """Chapter 7's blocked_matmul: tiled, but i, j, k inside the tile."""
    n, k_dim = a.shape
    m = b.shape[1]
    for i0 in range(0, n, 32):
        for j0 in range(0, m, 32):
            for k0 in range(0, k_dim, 32):
                for i in range(i0, min(i0 + 32, n)):
                    for j in range(j0, min(j0 + 32, m)):
                        acc = c[i, j]
                        for k in range(k0, min(k0 + 32, k_dim)):
                            acc += a[i, k] * b[k, j]
                        c[i, j] = acc


@njit(cache=False)
def decorative_tiles_kernel(a, b, c):
    """Stepped loops that do not bound the loops inside: not tiles."""
    m, k = a.shape
    n = b.shape[1]
    for i0 in range(0, 1, TILE):  # noqa: B007  (the point: the tile variables go unused)
        for p0 in range(0, 1, TILE):  # noqa: B007
            for j0 in range(0, 1, TILE):  # noqa: B007
                for i in range(m):
                    for p in range(k):
                        for j in range(n):
                            c[i, j] += a[i, p] * b[p, j]


@njit(cache=False)
def one_blocked_loop_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for j0 in range(0, n, TILE):
        for i in range(m):
            for p in range(k):
                for j in range(j0, min(j0 + TILE, n)):
                    c[i, j] += a[i, p] * b[p, j]


def _wrapper(kernel):
    def matmul_tiled(a, b):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
        kernel(a, b, c)
        return c

    return matmul_tiled


def matmul_tiled(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    matmul_tiled_kernel(a, b, c)
    return c


@njit(cache=False)
def stub_kernel(a, b, c):
    raise NotImplementedError("Exercise 8.1: loop over TILE-sized blocks")


TILING = "the kernel blocks i, k and j into tiles"
ORDER = "inside a tile: i-k-j, the innermost loop walks a row"


def test_8_1_reference_answer_scores_full_marks():
    result = run_cases("8.1", matmul_tiled, matmul_tiled_kernel, seed=0)
    assert result.score == result.max == 5, _feedback(result)


def test_8_1_plain_a_at_b_scores_zero():
    result = run_cases("8.1", lambda a, b: a @ b, stub_kernel, seed=1)
    assert result.score == 0, _feedback(result)
    result = run_cases("8.1", lambda a, b: a @ b, matmul_tiled_kernel, seed=1)
    assert result.score == 0 and "does not call matmul_tiled_kernel" in _feedback(result)


def test_8_1_the_library_kernels_are_refused():
    from mlsys_lab.kernels import cpu

    result = run_cases("8.1", lambda a, b: cpu.matmul_tiled(a, b), matmul_tiled_kernel, seed=2)
    _assert_zero(result, ["float32, odd sizes, inputs untouched",
                          "float64 and non-contiguous views"])
    assert "off limits" in _feedback(result)
    result = run_cases("8.1", _wrapper(cpu._tiled_kernel), cpu._tiled_kernel, seed=2)
    assert result.score == 0 and _refused(result), _feedback(result)


@pytest.mark.parametrize("kernel", [ikj_kernel, decorative_tiles_kernel, one_blocked_loop_kernel],
                         ids=["i-k-j, no tiling", "decorative stepped loops", "one blocked loop"])
def test_8_1_an_untiled_kernel_scores_zero_on_the_loop_nest(kernel):
    result = run_cases("8.1", _wrapper(kernel), kernel, seed=3)
    assert _rows(result)["float32, odd sizes, inputs untouched"].passed, _feedback(result)
    _assert_zero(result, [TILING, ORDER])


def test_8_1_a_tiled_ijk_kernel_fails_the_loop_order():
    result = run_cases("8.1", _wrapper(blocked_ijk_kernel), blocked_ijk_kernel, seed=4)
    rows = _rows(result)
    assert rows[TILING].passed, _feedback(result)
    _assert_zero(result, [ORDER])


def test_8_1_a_kernel_that_calls_a_library_product_fails_every_case():
    """Judged on the data a probe would send for `c[:, :] += a @ b` inside @njit (compiling it
    needs BLAS and takes long, so the judge gets the kernel's facts directly)."""
    source = "@njit\ndef matmul_tiled_kernel(a, b, c):\n    c[:, :] += a @ b\n"
    a, b = ch08_common.operands(45, 70, 39, np.float32, 0)
    facts = {"kind": "numba.core.registry.CPUDispatcher", "source": source, "consts": {},
             "wrapper_calls_kernel": True}
    with pytest.raises(AssertionError, match="hands the product to a library"):
        tiled._tiled_structure_judge({"facts": facts, "kernel_c": a @ b}, seed=0)
    facts["source"] = source.replace("a @ b", "np.dot(a, b)")
    with pytest.raises(AssertionError, match="dot"):
        tiled._tiled_float64_judge({"facts": facts, "runs": []}, seed=0)


def test_8_1_a_plain_python_kernel_is_not_accepted():
    result = run_cases("8.1", _wrapper(ikj_kernel.py_func), ikj_kernel.py_func, seed=5)
    assert result.score == 0 and "@njit" in _feedback(result)


# ============================================================================= 8.2 shared memory

TILE_CUDA = 8


@cuda.jit
def matmul_shared_kernel(a, b, c):
    a_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    b_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE_CUDA + ty
    col = cuda.blockIdx.x * TILE_CUDA + tx
    m, k = a.shape
    n = b.shape[1]
    acc = float32(0.0)
    for k0 in range(0, k, TILE_CUDA):
        a_tile[ty, tx] = a[row, k0 + tx] if row < m and k0 + tx < k else float32(0.0)
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < k and col < n else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE_CUDA):
            acc += a_tile[ty, kk] * b_tile[kk, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c[row, col] = acc


@cuda.jit
def global_reads_kernel(a, b, c):
    """Declares both tiles and hits both barriers, but multiplies from global memory."""
    a_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    b_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE_CUDA + ty
    col = cuda.blockIdx.x * TILE_CUDA + tx
    m, k = a.shape
    n = b.shape[1]
    acc = float32(0.0)
    for k0 in range(0, k, TILE_CUDA):
        a_tile[ty, tx] = float32(0.0)
        b_tile[ty, tx] = float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE_CUDA):
            if row < m and col < n and k0 + kk < k:
                acc += a[row, k0 + kk] * b[k0 + kk, col]
        cuda.syncthreads()
    if row < m and col < n:
        c[row, col] = acc


@cuda.jit
def one_barrier_kernel(a, b, c):
    a_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    b_tile = cuda.shared.array((TILE_CUDA, TILE_CUDA), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE_CUDA + ty
    col = cuda.blockIdx.x * TILE_CUDA + tx
    m, k = a.shape
    n = b.shape[1]
    acc = float32(0.0)
    for k0 in range(0, k, TILE_CUDA):
        a_tile[ty, tx] = a[row, k0 + tx] if row < m and k0 + tx < k else float32(0.0)
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < k and col < n else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE_CUDA):
            acc += a_tile[ty, kk] * b_tile[kk, tx]
    if row < m and col < n:
        c[row, col] = acc


def _launcher(kernel):
    def matmul_shared(a, b):
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = np.ascontiguousarray(b, dtype=np.float32)
        m, n = a.shape[0], b.shape[1]
        c = np.zeros((m, n), np.float32)
        grid = (math.ceil(n / TILE_CUDA), math.ceil(m / TILE_CUDA))
        kernel[grid, (TILE_CUDA, TILE_CUDA)](a, b, c)
        return c

    return matmul_shared


SHARED = "8×8 tiles in shared memory: A, B read once per block"


def test_8_2_reference_answer_scores_full_marks():
    result = run_cases("8.2", _launcher(matmul_shared_kernel), seed=0)
    assert result.score == result.max == 4, _feedback(result)


def test_8_2_numpy_without_a_kernel_scores_zero():
    result = run_cases("8.2", lambda a, b: np.asarray(a, np.float32) @ np.asarray(b, np.float32),
                       seed=1)
    assert result.score == 0, _feedback(result)
    assert "not on the host" in _feedback(result)


def test_8_2_shared_tiles_and_barriers_with_global_reads_score_zero_on_the_idea():
    result = run_cases("8.2", _launcher(global_reads_kernel), seed=2)
    _assert_zero(result, [SHARED])
    assert "read 24.0 times from global memory" in _rows(result)[SHARED].feedback


def test_8_2_one_barrier_per_tile_fails():
    result = run_cases("8.2", _launcher(one_barrier_kernel), seed=3)
    _assert_zero(result, [SHARED])


def test_8_2_the_library_cuda_kernels_are_refused():
    from mlsys_lab.kernels import cuda as kc

    def cheat(a, b):
        return kc.matmul_shared(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                config=kc.SIMULATOR_CONFIGS["shared"])

    result = run_cases("8.2", cheat, seed=4)
    assert result.score == 0 and _refused(result), _feedback(result)


def test_8_2_spy_counts_global_reads_per_element():
    m, k, n = smem.COUNT_SHAPE
    for kernel, per_a in [(matmul_shared_kernel, math.ceil(n / 8)), (global_reads_kernel, n)]:
        a, b = ch08_common.operands(m, k, n, np.float32, 0)
        with smem._SimulatorSpy() as spy:
            c = _launcher(kernel)(a, b)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
        assert smem._reads_of(spy.reads, m, k) == per_a * m * k


# ============================================================================= 8.3 roofline


def tile_intensity(m, n):
    return 2 * m * n / (m + n)


def gemm_bytes(m, n, k, dtype_bytes):
    return (m * k + k * n + m * n) * dtype_bytes


def attainable(intensity, peak, bandwidth):
    return min(peak, intensity * bandwidth)


def test_8_3_reference_answer_scores_full_marks_with_numpy_scalars_too():
    assert run_cases("8.3", tile_intensity, gemm_bytes, attainable, seed=0).score == 4
    result = run_cases("8.3", lambda m, n: np.float64(tile_intensity(m, n)), gemm_bytes,
                       lambda i, p, b: np.minimum(p, i * b), seed=0)
    assert result.score == 4, _feedback(result)


def test_8_3_the_library_roofline_is_refused():
    from mlsys_lab.kernels import roofline

    result = run_cases(
        "8.3", roofline.tile_intensity,
        lambda m, n, k, size: 2 * m * n * k / roofline.matmul_intensity(m, n, k, size),
        roofline.attainable, seed=1)
    assert result.score == 0 and _refused(result), _feedback(result)


def test_8_3_wrong_formulas_fail():
    result = run_cases("8.3", lambda m, n: m * n / (m + n),
                       lambda m, n, k, s: (m * k + k * n + 2 * m * n) * s,
                       lambda i, p, b: max(p, i * b), seed=2)
    _assert_zero(result, ["tile_intensity(m, n) = 2mn/(m+n)",
                          "gemm_bytes: A and B read, C written once",
                          "attainable = min(peak, I × bandwidth)"])


# ============================================================================= 8.4 Winograd


def winograd_f23(d, g):
    d0, d1, d2, d3 = d
    g0, g1, g2 = g
    u = [g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2]
    v = [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
    m0, m1, m2, m3 = (u[i] * v[i] for i in range(4))
    return [m0 + m1 + m2, m1 - m2 - m3]


def direct(d, g):
    return [d[0] * g[0] + d[1] * g[1] + d[2] * g[2], d[1] * g[0] + d[2] * g[1] + d[3] * g[2]]


def book_misprint(d, g):
    d0, d1, d2, d3 = d
    g0, g1, g2 = g
    u = [g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2]
    v = [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
    m0, m1, m2, m3 = (u[i] * v[i] for i in range(4))
    return [m0 + m1 - m2, m1 - m2 - m3]


def test_8_4_reference_answer_scores_full_marks():
    result = run_cases("8.4", winograd_f23, seed=0)
    assert result.score == result.max == 3, _feedback(result)


@pytest.mark.parametrize("cheat", [
    lambda d, g: __import__("mlsys_lab.kernels.conv", fromlist=["x"]).winograd_f23(d, g),
    lambda d, g: list(np.correlate(np.asarray(d), np.asarray(g), "valid")),
], ids=["conv.winograd_f23", "np.correlate"])
def test_8_4_library_shortcuts_are_refused(cheat):
    result = run_cases("8.4", cheat, seed=1)
    assert result.score == 0 and _refused(result), _feedback(result)


def test_8_4_the_winograd_kernels_transforms_are_refused():
    from mlsys_lab.kernels import winograd as W

    def transforms(d, g):
        v = W._bt.py_func(*d)
        u = [g[0], (g[0] + g[1] + g[2]) / 2, (g[0] - g[1] + g[2]) / 2, g[2]]
        return list(W._at.py_func(*(a * b for a, b in zip(u, v))))

    result = run_cases("8.4", transforms, seed=1)
    assert _refused(result), _feedback(result)
    assert "`mlsys_lab.kernels.winograd._bt`" in _feedback(result)


def test_8_4_direct_correlation_fails_the_multiply_count():
    result = run_cases("8.4", direct, seed=2)
    _assert_zero(result, ["4 data × filter multiplies (direct: 6)"])
    assert "6 times" in _feedback(result)


def test_8_4_the_books_misprinted_output_transform_fails():
    result = run_cases("8.4", book_misprint, seed=3)
    assert result.score == 0, _feedback(result)


def test_8_2_on_a_real_gpu_the_kernel_source_is_checked_instead():
    """Without the simulator the reads cannot be counted; the judge reads the kernel's source:
    global arrays read only into the shared tiles, two barriers."""
    good = textwrap.dedent(inspect.getsource(matmul_shared_kernel.py_func))
    smem._shared_static([good], "on the GPU")
    for kernel in (global_reads_kernel, one_barrier_kernel):
        with pytest.raises(AssertionError, match="multiply from the shared tiles"):
            smem._shared_static([textwrap.dedent(inspect.getsource(kernel.py_func))], "on the GPU")


@njit(cache=False)
def local_accumulator_kernel(a, b, c):
    """A different honest layout: a T×T accumulator per tile, offsets inside the tile."""
    m, k = a.shape
    n = b.shape[1]
    acc = np.zeros((TILE, TILE), a.dtype)
    for i0 in range(0, m, TILE):
        for j0 in range(0, n, TILE):
            acc[:, :] = 0
            ni, nj = min(TILE, m - i0), min(TILE, n - j0)
            for p0 in range(0, k, TILE):
                for ii in range(ni):
                    for p in range(p0, min(p0 + TILE, k)):
                        a_ip = a[i0 + ii, p]
                        for jj in range(nj):
                            acc[ii, jj] += a_ip * b[p, j0 + jj]
            for ii in range(ni):
                for jj in range(nj):
                    c[i0 + ii, j0 + jj] += acc[ii, jj]


def test_8_1_another_honest_tiling_passes():
    result = run_cases("8.1", _wrapper(local_accumulator_kernel), local_accumulator_kernel, seed=6)
    assert result.score == 5, _feedback(result)
