"""Exercise 8.1: a cache-tiled CPU matmul in Numba.

Scored on correctness and on the structure of the submitted kernel's own loop nest (blocked
loops that drive the loops inside, i-k-j order inside a tile), read from its source — never by
timing.

Wrong ideas rejected: ``a @ b`` (or ``np.dot``, inside or outside the kernel) has no kernel
doing the work; an i-k-j (or i-j-k) kernel without blocking has no tile loops; stepped loops
that do not bound the loops inside them are not tiles; blocking only one or two loops is not the
three-level tiling asked for; a tiled i-j-k kernel (chapter 7's ``blocked_matmul``) reads a
column of B in its innermost loop, which the loop-order case rejects. The loop nest is read from
the kernel's source, never timed.
"""

import ast

import numpy as np

from mlsys_lab.grading.core.exercise import DEFAULT_ALLOWED, Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch08_hardware_accelerators.common import (
    expect_product,
    function_def,
    names_in,
    operands,
    source_of,
)

# ----------------------------------------------------------------------------- probes

#: Shapes for the float32 case: odd sizes, one smaller and one larger than a 64 tile.
TILED_SHAPES = [(37, 23, 41), (1, 5, 1), (70, 65, 67)]


def _kernel_facts(matmul_tiled, kernel):
    """What the check needs to know about the kernel: Numba or not, its source, the int
    constants it reads from its globals, and whether ``matmul_tiled`` refers to it."""
    py = getattr(kernel, "py_func", kernel)
    code = getattr(py, "__code__", None)
    scope = getattr(py, "__globals__", {})
    consts = {name: scope[name] for name in (code.co_names if code else ())
              if type(scope.get(name)) is int}
    wrapper = getattr(matmul_tiled, "__code__", None)
    names = set()
    todo = [wrapper] if wrapper is not None else []
    while todo:
        c = todo.pop()
        names |= set(c.co_names)
        todo.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    wrapper_scope = getattr(matmul_tiled, "__globals__", {})
    closure = [cell.cell_contents for cell in getattr(matmul_tiled, "__closure__", None) or ()]
    calls = any(wrapper_scope.get(n) is kernel for n in names) or any(c is kernel for c in closure)
    kind = f"{type(kernel).__module__}.{type(kernel).__qualname__}"
    return {"kind": kind, "source": source_of(py) if code else None, "consts": consts,
            "wrapper_calls_kernel": calls}


def _run_kernel(kernel, a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    kernel(a, b, c)
    return c


def _tiled_float32_probe(matmul_tiled, kernel, seed):
    runs = []
    for m, k, n in TILED_SHAPES:
        a, b = operands(m, k, n, np.float32, seed + m)
        c = matmul_tiled(a, b)
        runs.append({"c": c, "a_after": a, "b_after": b, "kernel_c": _run_kernel(kernel, a, b)})
    return {"facts": _kernel_facts(matmul_tiled, kernel), "runs": runs}


def _views(seed):
    rng = np.random.default_rng(seed)
    a, b = operands(29, 31, 17, np.float64, seed)
    a_t = rng.standard_normal((31, 29)).T  # (29×31), column-major
    b_s = rng.standard_normal((31, 34))[:, ::2]  # (31×17), every other column
    return [(a, b), (a_t, b_s)]


def _tiled_float64_probe(matmul_tiled, kernel, seed):
    return {"facts": _kernel_facts(matmul_tiled, kernel),
            "runs": [matmul_tiled(a, b) for a, b in _views(seed)]}


def _tiled_structure_probe(matmul_tiled, kernel, seed):
    a, b = operands(45, 70, 39, np.float32, seed)
    return {"facts": _kernel_facts(matmul_tiled, kernel), "kernel_c": _run_kernel(kernel, a, b)}


# ----------------------------------------------------------------------------- judges

_LIBRARY_PRODUCTS = {"dot", "matmul", "einsum", "tensordot", "inner", "vdot", "outer", "kron"}


def _check_facts(raw, what):
    """The kernel is a Numba kernel computing with its own loops, called by matmul_tiled;
    return its function definition (an ``ast.FunctionDef``) and its int globals."""
    if not isinstance(raw, dict) or not isinstance(raw.get("facts"), dict):
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    facts = raw["facts"]
    if not str(facts.get("kind", "")).startswith("numba."):
        raise AssertionError(f"{what}: matmul_tiled_kernel is a {facts.get('kind')}; decorate "
                             "it with @njit so it compiles to machine code")
    source = facts.get("source")
    if not isinstance(source, str):
        raise AssertionError(f"{what}: the check cannot read the source of matmul_tiled_kernel "
                             "(define it in a notebook cell and run that cell)")
    try:
        fn = function_def(source)
    except (SyntaxError, StopIteration):
        raise AssertionError(f"{what}: the source of matmul_tiled_kernel does not parse") from None
    for node in ast.walk(fn):
        called = node.func if isinstance(node, ast.Call) else None
        name = getattr(called, "attr", getattr(called, "id", None))
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)) \
                or name in _LIBRARY_PRODUCTS:
            raise AssertionError(f"{what}: matmul_tiled_kernel hands the product to a library "
                                 f"({'@' if name is None else name}); compute it with your own "
                                 "loops")
    if facts.get("wrapper_calls_kernel") is not True:
        raise AssertionError(f"{what}: matmul_tiled does not call matmul_tiled_kernel; compute "
                             "the result with the kernel")
    consts = facts.get("consts") if isinstance(facts.get("consts"), dict) else {}
    return fn, consts


def _tiled_float32_judge(raw, seed):
    _check_facts(raw, "float32")
    runs = raw["runs"] if isinstance(raw.get("runs"), list) else []
    if len(runs) != len(TILED_SHAPES):
        raise AssertionError(f"float32: expected {len(TILED_SHAPES)} results, got {describe(runs)}")
    for (m, k, n), run in zip(TILED_SHAPES, runs):
        a, b = operands(m, k, n, np.float32, seed + m)
        shape = f"({m}×{k}) @ ({k}×{n})"
        expect_product(run["c"], a, b, f"matmul_tiled on float32 {shape}", rtol=1e-5)
        if not (np.array_equal(run["a_after"], a) and np.array_equal(run["b_after"], b)):
            raise AssertionError(f"matmul_tiled on {shape} changed its inputs")
        expect_product(run["kernel_c"], a, b,
                        f"matmul_tiled_kernel(a, b, c) with c = zeros, on float32 {shape}",
                        rtol=1e-5)


def _tiled_float64_judge(raw, seed):
    _check_facts(raw, "float64")
    runs = raw["runs"] if isinstance(raw.get("runs"), list) else []
    labels = ["float64 (29×31) @ (31×17)", "a transposed (29×31) @ a strided (31×17) view"]
    if len(runs) != len(labels):
        raise AssertionError(f"float64: expected {len(labels)} results, got {describe(runs)}")
    for (a, b), c, label in zip(_views(seed), runs, labels):
        expect_product(c, a, b, f"matmul_tiled on {label}", rtol=1e-12)


def _last_index(subscript):
    """The last index of a subscript (``j`` in ``c[i, j]``)."""
    index = subscript.slice
    return index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else index


def _range_args(loop):
    """The arguments of ``for v in range(...)`` / ``prange(...)``, else None."""
    it = loop.iter
    if not isinstance(it, ast.Call) or it.keywords:
        return None
    name = getattr(it.func, "id", getattr(it.func, "attr", None))
    return it.args if name in ("range", "prange") else None


def _tile_step(loop, consts):
    """True for ``for v in range(lo, hi, step)`` with a step other than 1 (a tile loop)."""
    args = _range_args(loop)
    if args is None or len(args) != 3 or not isinstance(loop.target, ast.Name):
        return False
    step = args[2]
    if isinstance(step, ast.Constant):
        return isinstance(step.value, int) and step.value >= 2
    if isinstance(step, ast.Name) and step.id in consts:
        return consts[step.id] >= 2
    return True  # a local name or an expression (a tile size the kernel computes)


def _depends(fn):
    """name -> every name it is computed from (assignments and loop targets, transitively)."""
    direct: dict[str, set[str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in names_in(target):
                    direct.setdefault(name, set()).update(names_in(node.value))
        elif isinstance(node, ast.For):
            for name in names_in(node.target):
                direct.setdefault(name, set()).update(names_in(node.iter))
    closed = {}
    for name in direct:
        seen, todo = set(), [name]
        while todo:
            for dep in direct.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        closed[name] = seen
    return closed


def _loop_paths(fn):
    """Every innermost ``for`` loop with the loops around it, outermost first."""
    paths = []

    def visit(node, path):
        inner = [child for child in ast.iter_child_nodes(node)]
        for child in inner:
            if isinstance(child, ast.For):
                here = path + [child]
                if not any(isinstance(n, ast.For) for n in ast.walk(child) if n is not child):
                    paths.append(here)
                visit(child, here)
            else:
                visit(child, path)

    visit(fn, [])
    return paths


def _tiled_path(fn, consts):
    """The innermost loop path with >= 3 tile loops whose variables all bound a loop inside
    them, or (None, advice)."""
    deps = _depends(fn)
    best_tiles, unused = 0, None
    for path in _loop_paths(fn):
        tiles = [loop for loop in path if _tile_step(loop, consts)]
        best_tiles = max(best_tiles, len(tiles))
        if len(tiles) < 3:
            continue
        for tile in tiles:
            var = tile.target.id
            inside = [loop for loop in path[path.index(tile) + 1:] if not _tile_step(loop, consts)]
            if not any(var in used or any(var in deps.get(name, ()) for name in used)
                       for used in (names_in(loop.iter) for loop in inside)):
                unused = var
                break
        else:
            return path, ""
    if unused is not None:
        return None, (f"the tile loop over `{unused}` does not bound any loop inside it: the "
                      f"loops of a tile run from the tile's start to its end (e.g. "
                      f"range({unused}, min({unused} + TILE, n)))")
    return None, (f"found {best_tiles} blocked loop(s) (`for i0 in range(0, m, TILE)`, a step "
                  "other than 1); block all three loops, i, k and j, into tiles")


def _structure_common(raw, seed, what):
    fn, consts = _check_facts(raw, what)
    a, b = operands(45, 70, 39, np.float32, seed)
    expect_product(raw.get("kernel_c"), a, b, f"{what}: matmul_tiled_kernel on (45×70) @ (70×39)",
                    rtol=1e-5)
    return fn, consts


def _tiled_structure_judge(raw, seed):
    fn, consts = _structure_common(raw, seed, "tiling")
    path, advice = _tiled_path(fn, consts)
    if path is None:
        raise AssertionError(f"tiling: {advice}")


def _tiled_order_judge(raw, seed):
    fn, consts = _structure_common(raw, seed, "loop order")
    path, advice = _tiled_path(fn, consts)
    if path is None:
        raise AssertionError(f"loop order inside a tile: first tile the loops ({advice})")
    inner = path[-1]
    var = inner.target.id if isinstance(inner.target, ast.Name) else "?"
    for node in ast.walk(inner):
        if isinstance(node, (ast.AugAssign, ast.Assign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            writes_row = any(isinstance(t, ast.Subscript) and var in names_in(_last_index(t))
                             for t in targets)
            reads_row = any(isinstance(s, ast.Subscript) and var in names_in(_last_index(s))
                            for s in ast.walk(node.value))
            multiplies = any(isinstance(op, ast.BinOp) and isinstance(op.op, ast.Mult)
                             for op in ast.walk(node.value))
            if writes_row and reads_row and multiplies:
                return
    raise AssertionError(
        f"loop order inside a tile: the innermost loop (over `{var}`) should walk a row of C and "
        f"a row of B at unit stride — i, k, j order: c[i, j] += a[i, p] * b[p, j] with `{var}` "
        "the last index of both (in i, j, k order the innermost loop reads a column of B)"
    )


register(
    Exercise(
        id="8.1",
        title="A cache-tiled CPU matmul in Numba",
        target=("matmul_tiled", "matmul_tiled_kernel"),
        task="the tiled matmul kernel",
        forbidden=("mlsys_lab.kernels.cpu",),
        allowed=DEFAULT_ALLOWED + ("numba",),  # the kernel is an @njit function
        cases=(
            Case("float32, odd sizes, inputs untouched", 1,
                 feedback="c = a @ b for any (m×k) @ (k×n)",
                 probe=_tiled_float32_probe, judge=_tiled_float32_judge),
            Case("float64 and non-contiguous views", 1,
                 feedback="keep the dtype; make the operands contiguous first",
                 probe=_tiled_float64_probe, judge=_tiled_float64_judge),
            Case("the kernel blocks i, k and j into tiles", 2,
                 feedback="tile loops with a step, whose variables bound the loops inside",
                 probe=_tiled_structure_probe, judge=_tiled_structure_judge),
            Case("inside a tile: i-k-j, the innermost loop walks a row", 1,
                 feedback="c[i, j] += a[i, p] * b[p, j] with j innermost",
                 probe=_tiled_structure_probe, judge=_tiled_order_judge),
        ),
    ),
)
