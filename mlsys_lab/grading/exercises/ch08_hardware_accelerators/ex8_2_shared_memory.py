"""Exercise 8.2: a shared-memory tiled CUDA kernel.

Run under Numba's CUDA simulator on tiny odd sizes while the check counts the kernel's reads of
global memory (on a real GPU, the kernel's source is read instead). CUDA needs the simulator
switched on *before numba is first imported* (``NUMBA_ENABLE_CUDASIM=1``), so the notebook's
first cell sets it; this module imports numba only inside the cases, so importing it never
switches numba into one mode or the other.

Wrong ideas rejected: numpy (or any host code) reads no operand inside a kernel; a naive kernel,
or one that declares both shared tiles and both barriers but still multiplies from global
memory, reads each element of A n times instead of once per block column (counted on the
simulator); a kernel with one barrier, or tiles of the wrong shape, fails the tile/barrier
counts; unguarded loads at the edges fail the odd shapes.
"""

import ast
import math
import sys
import threading

import numpy as np

from mlsys_lab.grading.core.exercise import DEFAULT_ALLOWED, Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch08_hardware_accelerators.common import (
    expect_product,
    function_def,
    names_in,
    operands,
    source_of,
)

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
            out.append(source_of(fn))
    return out


def _shared_run(matmul_shared, shape, seed):
    """Run the answer on one shape; on the simulator, with the spy counting."""
    m, k, n = shape
    a, b = operands(m, k, n, np.float32, seed)
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
    a, b = operands(m, k, n, np.float32, seed)
    expect_product(raw.get("c"), a, b, what, rtol=1e-5)
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
        fn = function_def(source)
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
                into_tile = any(isinstance(t, ast.Subscript) and names_in(t.value) & tiles
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


register(
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
)
