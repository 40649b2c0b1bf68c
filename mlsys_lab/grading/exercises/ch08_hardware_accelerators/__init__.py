"""Checks for chapter 8, hardware accelerators (``solutions/ch08_hardware_accelerators.ipynb``).

8.1 a cache-tiled CPU matmul in Numba, scored on correctness and on the structure of the
submitted kernel's own loop nest (blocked loops that drive the loops inside, i-k-j order inside
a tile), read from its source — never by timing; 8.2 a shared-memory tiled CUDA kernel, run under
Numba's CUDA simulator on tiny odd sizes while the check counts the kernel's reads of global
memory; 8.3 compute-intensity and roofline arithmetic; 8.4 Winograd F(2,3) written out by hand,
with its data × filter multiplies counted.

CUDA needs Numba's simulator switched on *before numba is first imported*
(``NUMBA_ENABLE_CUDASIM=1``), so the notebook's first cell sets it. This module imports numba
only inside the cases, so importing it never switches numba into one mode or the other.
"""

from __future__ import annotations

import ast
import inspect
import math
import numbers
import sys
import textwrap
import threading

import numpy as np

from mlsys_lab.grading.core.exercise import (
    DEFAULT_ALLOWED,
    Case,
    Exercise,
    describe,
    expect_close,
    plain,
    register,
)

# ----------------------------------------------------------------------------- shared helpers


def _operands(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


def _expect_product(c, a, b, what, rtol):
    """Assert that ``c`` is ``a @ b``: an ndarray of the right shape and dtype, close in value."""
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    if not isinstance(c, np.ndarray):
        raise AssertionError(f"{what} returned {describe(c)}; return a numpy array")
    if c.shape != expected.shape:
        raise AssertionError(f"{what} returned shape {c.shape}, expected {expected.shape}")
    if c.dtype != np.asarray(a).dtype:
        raise AssertionError(
            f"{what} returned dtype {c.dtype}; keep the inputs' dtype {np.asarray(a).dtype}"
        )
    scale = rtol * (1 + np.abs(expected).max()) * math.sqrt(max(np.asarray(a).shape[1], 1))
    err = float(np.abs(c.astype(np.float64) - expected).max()) if c.size else 0.0
    if not err <= scale:
        where = np.unravel_index(np.argmax(np.abs(c - expected)), c.shape)
        raise AssertionError(
            f"{what}: off by up to {err:.3g} (worst at c{list(map(int, where))}); "
            f"expected a @ b within {scale:.1g}"
        )


def _source_of(fn):
    """The source text of a Python function (a kernel's ``py_func``), or None."""
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def _function_def(source):
    """The first function definition in ``source`` (judge side)."""
    tree = ast.parse(source)
    return next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef))


def _names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _last_index(subscript):
    index = subscript.slice
    return index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else index


# ============================================================================= 8.1 tiled CPU matmul
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
    return {"kind": kind, "source": _source_of(py) if code else None, "consts": consts,
            "wrapper_calls_kernel": calls}


def _run_kernel(kernel, a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    kernel(a, b, c)
    return c


def _tiled_float32_probe(matmul_tiled, kernel, seed):
    runs = []
    for m, k, n in TILED_SHAPES:
        a, b = _operands(m, k, n, np.float32, seed + m)
        c = matmul_tiled(a, b)
        runs.append({"c": c, "a_after": a, "b_after": b, "kernel_c": _run_kernel(kernel, a, b)})
    return {"facts": _kernel_facts(matmul_tiled, kernel), "runs": runs}


def _views(seed):
    rng = np.random.default_rng(seed)
    a, b = _operands(29, 31, 17, np.float64, seed)
    a_t = rng.standard_normal((31, 29)).T  # (29×31), column-major
    b_s = rng.standard_normal((31, 34))[:, ::2]  # (31×17), every other column
    return [(a, b), (a_t, b_s)]


def _tiled_float64_probe(matmul_tiled, kernel, seed):
    return {"facts": _kernel_facts(matmul_tiled, kernel),
            "runs": [matmul_tiled(a, b) for a, b in _views(seed)]}


def _tiled_structure_probe(matmul_tiled, kernel, seed):
    a, b = _operands(45, 70, 39, np.float32, seed)
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
        fn = _function_def(source)
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
        a, b = _operands(m, k, n, np.float32, seed + m)
        shape = f"({m}×{k}) @ ({k}×{n})"
        _expect_product(run["c"], a, b, f"matmul_tiled on float32 {shape}", rtol=1e-5)
        if not (np.array_equal(run["a_after"], a) and np.array_equal(run["b_after"], b)):
            raise AssertionError(f"matmul_tiled on {shape} changed its inputs")
        _expect_product(run["kernel_c"], a, b,
                        f"matmul_tiled_kernel(a, b, c) with c = zeros, on float32 {shape}",
                        rtol=1e-5)


def _tiled_float64_judge(raw, seed):
    _check_facts(raw, "float64")
    runs = raw["runs"] if isinstance(raw.get("runs"), list) else []
    labels = ["float64 (29×31) @ (31×17)", "a transposed (29×31) @ a strided (31×17) view"]
    if len(runs) != len(labels):
        raise AssertionError(f"float64: expected {len(labels)} results, got {describe(runs)}")
    for (a, b), c, label in zip(_views(seed), runs, labels):
        _expect_product(c, a, b, f"matmul_tiled on {label}", rtol=1e-12)


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
                for name in _names_in(target):
                    direct.setdefault(name, set()).update(_names_in(node.value))
        elif isinstance(node, ast.For):
            for name in _names_in(node.target):
                direct.setdefault(name, set()).update(_names_in(node.iter))
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
                       for used in (_names_in(loop.iter) for loop in inside)):
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
    a, b = _operands(45, 70, 39, np.float32, seed)
    _expect_product(raw.get("kernel_c"), a, b, f"{what}: matmul_tiled_kernel on (45×70) @ (70×39)",
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
            writes_row = any(isinstance(t, ast.Subscript) and var in _names_in(_last_index(t))
                             for t in targets)
            reads_row = any(isinstance(s, ast.Subscript) and var in _names_in(_last_index(s))
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


# ============================================================================= 8.2 shared memory

CUDA_TILE = 8
#: The counting case: (m, k, n) all different, so A, B and C are told apart by their shapes.
COUNT_SHAPE = (17, 10, 24)


def _simulated():
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _gpu_available():
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver raises
        return False


class _SimulatorSpy:
    """While active, record the shapes of ``cuda.shared.array`` calls, count
    ``cuda.syncthreads`` calls and count element reads of each global (device) array, by the
    shape of the array read, in kernels running in Numba's CUDA simulator."""

    def __init__(self):
        from numba.cuda.simulator import kernelapi
        from numba.cuda.simulator.cudadrv import devicearray

        self.api, self.devicearray = kernelapi, devicearray
        self.shapes: list[tuple] = []
        self.syncs = 0
        self.reads: dict[tuple, int] = {}
        self.lock = threading.Lock()

    def __enter__(self):
        api, spy = self.api, self
        shared, module = api.FakeCUDAShared, api.FakeCUDAModule
        fake_array = self.devicearray.FakeCUDAArray
        self._saved = (shared.array, module.syncthreads, fake_array.__getitem__)
        original_array, original_sync, original_getitem = self._saved

        def array(shared_self, shape, dtype, alignment=None):
            with spy.lock:
                spy.shapes.append(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
            allocations = getattr(shared_self, "_allocations", None)
            if shape == 0 or allocations is None:
                return original_array(shared_self, shape, dtype, alignment)
            # The simulator tells shared arrays apart by the caller's file and line; keep that.
            # The lock makes every thread of a block get the same array (the simulator's own
            # check-then-create can race and hand two threads two arrays).
            frame = sys._getframe(1)
            key = (frame.f_code.co_filename, frame.f_lineno)
            with spy.lock:
                if key not in allocations:
                    from numba.core import types
                    from numba.np import numpy_support

                    if isinstance(dtype, types.Type):
                        dtype = numpy_support.as_dtype(dtype)
                    allocations[key] = np.empty(shape, dtype)
                return allocations[key]

        def syncthreads(module_self):
            with spy.lock:
                spy.syncs += 1
            return original_sync(module_self)

        def getitem(array_self, index):
            value = original_getitem(array_self, index)
            if not isinstance(value, fake_array):  # an element, not a view
                root = array_self._ary
                while isinstance(root.base, np.ndarray):
                    root = root.base
                with spy.lock:
                    spy.reads[root.shape] = spy.reads.get(root.shape, 0) + 1
            return value

        shared.array, module.syncthreads, fake_array.__getitem__ = array, syncthreads, getitem
        return self

    def __exit__(self, *exc):
        api = self.api
        (api.FakeCUDAShared.array, api.FakeCUDAModule.syncthreads,
         self.devicearray.FakeCUDAArray.__getitem__) = self._saved
        return False


def _cuda_sources(matmul_shared):
    """Sources of the CUDA kernels ``matmul_shared`` refers to (for a real GPU)."""
    out = []
    code = getattr(matmul_shared, "__code__", None)
    scope = getattr(matmul_shared, "__globals__", {})
    for name in code.co_names if code else ():
        fn = getattr(scope.get(name), "py_func", None)
        if fn is not None and hasattr(fn, "__code__") and "cuda" in type(scope[name]).__module__:
            out.append(_source_of(fn))
    return out


def _shared_run(matmul_shared, shape, seed):
    """Run the answer on one shape; on the simulator, with the spy counting."""
    m, k, n = shape
    a, b = _operands(m, k, n, np.float32, seed)
    if _simulated():
        with _SimulatorSpy() as spy:
            c = matmul_shared(a, b)
        return {"simulated": True, "c": c, "shapes": spy.shapes, "syncs": spy.syncs,
                "reads": dict(spy.reads)}
    if not _gpu_available():
        return {"simulated": False, "gpu": False}
    return {"simulated": False, "gpu": True, "c": matmul_shared(a, b),
            "sources": _cuda_sources(matmul_shared)}


ONE_BLOCK = (5, 7, 3)
MANY_BLOCKS = [(11, 13, 9), (3, 17, 10)]


def _shared_one_block_probe(matmul_shared, seed):
    return _shared_run(matmul_shared, ONE_BLOCK, seed)


def _shared_many_blocks_probe(matmul_shared, seed):
    return [_shared_run(matmul_shared, shape, seed + i) for i, shape in enumerate(MANY_BLOCKS)]


def _shared_counting_probe(matmul_shared, seed):
    return _shared_run(matmul_shared, COUNT_SHAPE, seed)


# ----------------------------------------------------------------------------- judges


def _reads_of(reads, rows, cols):
    return sum(v for shape, v in reads.items() if isinstance(shape, tuple)
               and sorted(shape) == sorted((rows, cols)))


def _shared_result(raw, shape, seed, what):
    """Check one run: on the GPU, correct and computed by a kernel that read A and B."""
    m, k, n = shape
    if not isinstance(raw, dict) or "simulated" not in raw:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    if not raw["simulated"] and not raw.get("gpu"):
        raise AssertionError("no GPU here and Numba's CUDA simulator is off: run the notebook's "
                             "first cell (it sets NUMBA_ENABLE_CUDASIM=1 before numba is "
                             "imported), then restart the kernel")
    a, b = _operands(m, k, n, np.float32, seed)
    _expect_product(raw.get("c"), a, b, what, rtol=1e-5)
    if raw["simulated"]:
        reads = raw.get("reads") if isinstance(raw.get("reads"), dict) else {}
        for label, rows, cols in (("A", m, k), ("B", k, n)):
            if _reads_of(reads, rows, cols) < rows * cols:
                raise AssertionError(
                    f"{what}: a CUDA kernel read {_reads_of(reads, rows, cols)} elements of "
                    f"{label} ({rows}×{cols}) from global memory; compute c with a @cuda.jit "
                    "kernel that reads the operands, not on the host")
    else:
        sources = raw.get("sources") if isinstance(raw.get("sources"), list) else []
        if not any(isinstance(s, str) for s in sources):
            raise AssertionError(f"{what}: matmul_shared should launch a @cuda.jit kernel")


def _shared_one_block_judge(raw, seed):
    _shared_result(raw, ONE_BLOCK, seed, "matmul_shared on (5×7) @ (7×3)")


def _shared_many_blocks_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != len(MANY_BLOCKS):
        raise AssertionError(f"expected {len(MANY_BLOCKS)} results, got {describe(raw)}")
    for i, (shape, one) in enumerate(zip(MANY_BLOCKS, raw)):
        m, k, n = shape
        _shared_result(one, shape, seed + i, f"matmul_shared on ({m}×{k}) @ ({k}×{n})")


def _shared_counting_judge(raw, seed):
    m, k, n = COUNT_SHAPE
    what = f"matmul_shared on ({m}×{k}) @ ({k}×{n})"
    _shared_result(raw, COUNT_SHAPE, seed, what)
    if not raw["simulated"]:
        _shared_static(raw.get("sources") or [], what)
        return
    blocks_x, blocks_y = math.ceil(n / CUDA_TILE), math.ceil(m / CUDA_TILE)
    threads = blocks_x * blocks_y * CUDA_TILE * CUDA_TILE
    k_tiles = math.ceil(k / CUDA_TILE)
    tiles = [s for s in raw.get("shapes", []) if s != (0,)]
    if not tiles:
        raise AssertionError("the kernel never calls cuda.shared.array; stage an A tile and a B "
                             "tile in shared memory")
    if len(tiles) < 2 * threads:
        raise AssertionError(
            f"{len(tiles)} cuda.shared.array calls over {threads} threads; every thread should "
            "declare both the A tile and the B tile (two calls, outside the K loop)"
        )
    wrong = sorted({s for s in tiles if s != (CUDA_TILE, CUDA_TILE)})
    if wrong:
        raise AssertionError(f"shared tiles should be {CUDA_TILE}×{CUDA_TILE}; got shape(s) "
                             f"{wrong}")
    syncs = raw.get("syncs", 0)
    if syncs < 2 * k_tiles * threads:
        raise AssertionError(
            f"the kernel made {syncs} cuda.syncthreads() calls over {threads} threads; each "
            "K-tile needs two barriers per thread (after loading the tiles, and before "
            "overwriting them), or did the launch use fewer than "
            f"{CUDA_TILE}×{CUDA_TILE} threads per block?"
        )
    reads = raw.get("reads") if isinstance(raw.get("reads"), dict) else {}
    for label, rows, cols, reuse, across in (("A", m, k, blocks_x, "block column"),
                                             ("B", k, n, blocks_y, "block row")):
        per_element = _reads_of(reads, rows, cols) / (rows * cols)
        if per_element > 1.5 * reuse:
            raise AssertionError(
                f"{what}: each element of {label} was read {per_element:.1f} times from global "
                f"memory; with {CUDA_TILE}×{CUDA_TILE} tiles staged in shared memory each is read "
                f"once per {across} ({reuse} times here). Load the tile with one read per "
                "thread, then multiply from the shared arrays, not from the global ones"
            )


def _shared_static(sources, what):
    """On a real GPU: the kernel's source stages A and B in two shared tiles and multiplies
    from them (global reads only in stores to a shared tile)."""
    for source in sources:
        if not isinstance(source, str):
            continue
        fn = _function_def(source)
        params = {arg.arg for arg in fn.args.args}
        tiles = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and "shared" in ast.unparse(node.value.func):
                tiles |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        syncs = sum(isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "syncthreads"
                    for n in ast.walk(fn))
        if len(tiles) < 2 or syncs < 2:
            continue
        global_reads_ok = True
        for node in ast.walk(fn):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                into_tile = any(isinstance(t, ast.Subscript) and _names_in(t.value) & tiles
                                for t in targets)
                reads = {s.value.id for s in ast.walk(node.value) if isinstance(s, ast.Subscript)
                         and isinstance(s.value, ast.Name) and s.value.id in params}
                if reads and not into_tile:
                    global_reads_ok = False
        if global_reads_ok:
            return
    raise AssertionError(f"{what}: the kernel should declare two cuda.shared.array tiles, load "
                         "them from global memory with two cuda.syncthreads() barriers, and "
                         "multiply from the shared tiles only")


# ============================================================================= 8.3 intensity

RTX3080_PEAK = 29767.68e9
RTX3080_BW = 760e9


def _tile_sizes(seed):
    rng = np.random.default_rng(8300 + seed)
    return [(1, 1), (4, 4), (8, 8), (4, 8), (3, 1)] + [
        (int(a), int(b)) for a, b in rng.integers(1, 257, size=(4, 2))]


def _gemm_args(seed):
    rng = np.random.default_rng(8310 + seed)
    return [(2048, 2048, 1024, 4), (2048, 2048, 1024, 2), (1, 1, 1, 4)] + [
        (int(m), int(n), int(k), int(rng.choice([1, 2, 4, 8])))
        for m, n, k in rng.integers(1, 5000, size=(4, 3))]


def _roof_args(seed):
    rng = np.random.default_rng(8320 + seed)
    ridge = RTX3080_PEAK / RTX3080_BW
    out = [(i, RTX3080_PEAK, RTX3080_BW) for i in (0.25, 1.0, ridge, 100.0)]
    out.append((10.0, 1e12, 2e11))
    for _ in range(4):
        peak, bw = float(rng.uniform(1e12, 1e14)), float(rng.uniform(1e11, 5e12))
        out.append((float(peak / bw * rng.choice([0.1, 0.5, 2.0, 10.0])), peak, bw))
    return out


def _intensity_tiles_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(tile_intensity(m, n)) for m, n in _tile_sizes(seed)]


def _intensity_bytes_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(gemm_bytes(*args)) for args in _gemm_args(seed)]


def _intensity_roof_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(attainable(*args)) for args in _roof_args(seed)]


def _intensity_book_probe(tile_intensity, gemm_bytes, attainable):
    # An 8×8 float32 thread tile whose every load comes from DRAM, on the book's RTX 3080, and
    # the whole book GEMM (2048×2048×1024, float32) reading A, B and writing C once.
    return plain([attainable(tile_intensity(8, 8) / 4, RTX3080_PEAK, RTX3080_BW),
                   2 * 2048 * 2048 * 1024 / gemm_bytes(2048, 2048, 1024, 4)])


def _expect_numbers(raw, n, what):
    if not isinstance(raw, list) or len(raw) != n:
        raise AssertionError(f"{what}: expected {n} results, got {describe(raw)}")
    return raw


def _intensity_tiles_judge(raw, seed):
    sizes = _tile_sizes(seed)
    for (m, n), got in zip(sizes, _expect_numbers(raw, len(sizes), "tile_intensity")):
        expect_close(got, 2 * m * n / (m + n), f"tile_intensity({m}, {n})", rel=1e-9)


def _intensity_bytes_judge(raw, seed):
    args = _gemm_args(seed)
    for (m, n, k, size), got in zip(args, _expect_numbers(raw, len(args), "gemm_bytes")):
        expect_close(got, (m * k + k * n + m * n) * size, f"gemm_bytes({m}, {n}, {k}, {size})",
                     rel=1e-12)


def _intensity_roof_judge(raw, seed):
    args = _roof_args(seed)
    for (i, peak, bw), got in zip(args, _expect_numbers(raw, len(args), "attainable")):
        expect_close(got, min(peak, i * bw), f"attainable({i:g}, {peak:g}, {bw:g})", rel=1e-9)


def _intensity_book_judge(raw):
    got = _expect_numbers(raw, 2, "the book's numbers")
    expect_close(got[0], 2.0 * RTX3080_BW,
                 "attainable(tile_intensity(8, 8) / 4, 29767.68e9, 760e9)", rel=1e-9)
    expect_close(got[1], 256.0, "2·M·N·K / gemm_bytes(2048, 2048, 1024, 4)", rel=1e-9)


# ============================================================================= 8.4 Winograd F(2,3)


class _Counted:
    """A number that counts multiplies between two input-dependent values (data × filter)."""

    counter = None  # a one-element list, set by the case

    __array_priority__ = 1000  # numpy hands arithmetic with ndarrays to us

    def __init__(self, value):
        self.value = float(value)

    @staticmethod
    def _value(other):
        if isinstance(other, _Counted):
            return other.value
        if isinstance(other, (int, float, np.integer, np.floating)):
            return float(other)
        return NotImplemented

    def _binary(self, other, op, count=False):
        value = self._value(other)
        if value is NotImplemented:
            return NotImplemented
        if count and isinstance(other, _Counted):
            _Counted.counter[0] += 1
        return _Counted(op(self.value, value))

    def __add__(self, other):
        return self._binary(other, lambda x, y: x + y)

    def __radd__(self, other):
        return self._binary(other, lambda x, y: y + x)

    def __sub__(self, other):
        return self._binary(other, lambda x, y: x - y)

    def __rsub__(self, other):
        return self._binary(other, lambda x, y: y - x)

    def __mul__(self, other):
        return self._binary(other, lambda x, y: x * y, count=True)

    def __rmul__(self, other):
        return self._binary(other, lambda x, y: y * x, count=True)

    def __truediv__(self, other):
        if isinstance(other, _Counted):
            raise TypeError("divide only by constants in Winograd F(2,3)")
        return self._binary(other, lambda x, y: x / y)

    def __neg__(self):
        return _Counted(-self.value)

    def __pos__(self):
        return self

    def __float__(self):
        raise TypeError("the check passes special numbers that count multiplies; do the "
                        "arithmetic on the elements as given (no float(...) or dtype=float)")


def _correlation(d, g):
    """The 3-tap correlation at two positions (the judges' reference)."""
    return np.correlate(np.asarray(d, np.float64), np.asarray(g, np.float64), "valid").tolist()


def _winograd_inputs(seed):
    rng = np.random.default_rng(8400 + seed)
    cases = [([1.0, 2.0, 3.0, 4.0], [1.0, 0.0, -1.0])]
    return cases + [([float(x) for x in rng.standard_normal(4)],
                     [float(x) for x in rng.standard_normal(3)]) for _ in range(20)]


def _as_list(result):
    """The answer's outputs as a list (a list, a tuple or an array of numbers)."""
    if isinstance(result, np.ndarray):
        return [v.item() if isinstance(v, np.generic) else v for v in result.ravel()]
    return plain(list(result)) if isinstance(result, (list, tuple)) else result


def _winograd_values_probe(winograd_f23, seed):
    return [_as_list(winograd_f23(list(d), list(g))) for d, g in _winograd_inputs(seed)]


COUNTED_D, COUNTED_G = (0.5, -1.25, 2.0, 0.75), (1.5, -0.5, 0.25)


def _winograd_multiplies_probe(winograd_f23):
    _Counted.counter = [0]
    try:
        result = _as_list(winograd_f23([_Counted(v) for v in COUNTED_D],
                                       [_Counted(v) for v in COUNTED_G]))
    finally:
        count, _Counted.counter = _Counted.counter[0], None
    if isinstance(result, list):
        result = [v.value if isinstance(v, _Counted) else v for v in result]
    return {"count": count, "values": result}


def _two_numbers(values, what):
    if not isinstance(values, list) or len(values) != 2:
        raise AssertionError(f"{what} returned {describe(values)}; F(2,3) gives 2 outputs")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values):
        raise AssertionError(f"{what} returned {describe(values)}; return 2 numbers")
    return [float(v) for v in values]


def _winograd_values_judge(raw, seed):
    cases = _winograd_inputs(seed)
    if not isinstance(raw, list) or len(raw) != len(cases):
        raise AssertionError(f"expected {len(cases)} results, got {describe(raw)}")
    for (d, g), values in zip(cases, raw):
        got = _two_numbers(values, "winograd_f23")
        expected = _correlation(d, g)
        if not np.allclose(got, expected, rtol=1e-9, atol=1e-12):
            shown = [round(x, 4) for x in d], [round(x, 4) for x in g]
            raise AssertionError(
                f"winograd_f23(d={shown[0]}, g={shown[1]}) returned "
                f"{[round(x, 6) for x in got]}, expected {[round(x, 6) for x in expected]} "
                "(the 3-tap correlation at two positions); check your output transform Aᵀ"
            )


def _winograd_multiplies_judge(raw):
    if not isinstance(raw, dict) or "count" not in raw:
        raise AssertionError(f"the check got {describe(raw)}")
    got = _two_numbers(raw["values"], "winograd_f23 on the counting inputs")
    if not np.allclose(got, _correlation(COUNTED_D, COUNTED_G)):
        raise AssertionError("winograd_f23 gave wrong outputs on the counting inputs")
    if raw["count"] != 4:
        raise AssertionError(
            f"winograd_f23 multiplied input-dependent values {raw['count']} times; Winograd "
            "F(2,3) needs exactly 4 (the element-wise product of the transformed filter and "
            "data; the transforms themselves only add, subtract or scale by constants)"
        )


# ============================================================================= registry

register(
    # 8.1. A wrong idea that still produces plausible output would fail because: `a @ b` (or
    # np.dot, inside or outside the kernel) has no kernel doing the work; an i-k-j (or i-j-k)
    # kernel without blocking has no tile loops; stepped loops that do not bound the loops
    # inside them are not tiles; blocking only one or two loops is not the three-level tiling
    # asked for; a tiled i-j-k kernel (chapter 7's blocked_matmul) reads a column of B in its
    # innermost loop, which the loop-order case rejects. The loop nest is read from the
    # kernel's source, never timed.
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
    # 8.2. A wrong idea that still produces plausible output would fail because: numpy (or any
    # host code) reads no operand inside a kernel; a naive kernel, or one that declares both
    # shared tiles and both barriers but still multiplies from global memory, reads each
    # element of A n times instead of once per block column (counted on the simulator); a
    # kernel with one barrier, or tiles of the wrong shape, fails the tile/barrier counts;
    # unguarded loads at the edges fail the odd shapes.
    Exercise(
        id="8.2",
        title="A shared-memory tiled CUDA kernel",
        target="matmul_shared",
        task="the shared-memory CUDA kernel",
        forbidden=("mlsys_lab.kernels.cuda",),
        allowed=DEFAULT_ALLOWED + ("numba",),  # a @cuda.jit kernel, on numba's simulator
        cases=(
            Case("(5×7) @ (7×3): one block", 1, feedback="c = a @ b, float32, in a CUDA kernel",
                 probe=_shared_one_block_probe, judge=_shared_one_block_judge),
            Case("several blocks and K-tiles, clipped edges", 1,
                 feedback="guard loads and stores at the matrix edges",
                 probe=_shared_many_blocks_probe, judge=_shared_many_blocks_judge),
            Case(f"{CUDA_TILE}×{CUDA_TILE} tiles in shared memory: A, B read once per block", 2,
                 feedback="stage tiles in cuda.shared.array and multiply from them",
                 probe=_shared_counting_probe, judge=_shared_counting_judge),
        ),
    ),
    # 8.3. A wrong idea that still produces plausible output would fail because: forgetting the
    # 2 FLOPs per multiply-add halves tile_intensity; counting C as read and written doubles its
    # bytes; max instead of min, or peak / intensity, breaks attainable on one side of the
    # ridge; fixed answers fail the random sizes drawn each run.
    Exercise(
        id="8.3",
        title="Compute intensity and the roofline",
        target=("tile_intensity", "gemm_bytes", "attainable"),
        task="the roofline arithmetic",
        forbidden=("mlsys_lab.kernels.roofline",),
        cases=(
            Case("tile_intensity(m, n) = 2mn/(m+n)", 1, feedback="2·m·n FLOPs per m + n loads",
                 probe=_intensity_tiles_probe, judge=_intensity_tiles_judge),
            Case("gemm_bytes: A and B read, C written once", 1, feedback="(mk + kn + mn) × bytes",
                 probe=_intensity_bytes_probe, judge=_intensity_bytes_judge),
            Case("attainable = min(peak, I × bandwidth)", 1, feedback="the lower of the two roofs",
                 probe=_intensity_roof_probe, judge=_intensity_roof_judge),
            Case("the book's RTX 3080: 8×8 tile and whole GEMM", 1,
                 feedback="1520 GFLOP/s and 256 FLOP/byte",
                 probe=_intensity_book_probe, judge=_intensity_book_judge),
        ),
    ),
    # 8.4. A wrong idea that still produces plausible output would fail because: the direct
    # correlation multiplies 6 times; the book's misprinted Aᵀ (first row 1, 1, -1, 0) gives
    # wrong outputs; converting to floats (np.asarray(..., float), the library's winograd_f23,
    # np.correlate) cannot count multiplies and is refused or raises on the counting inputs.
    Exercise(
        id="8.4",
        title="Winograd F(2,3) by hand",
        target="winograd_f23",
        task="Winograd F(2,3)",
        forbidden=("mlsys_lab.kernels.conv", "numpy:correlate", "numpy:convolve"),
        cases=(
            Case("equals the direct 3-tap correlation", 2, feedback="y = Aᵀ[(G g) ⊙ (Bᵀ d)]",
                 probe=_winograd_values_probe, judge=_winograd_values_judge),
            Case("4 data × filter multiplies (direct: 6)", 1,
                 feedback="only the element-wise product multiplies data by filter",
                 probe=_winograd_multiplies_probe, judge=_winograd_multiplies_judge),
        ),
    ),
)
