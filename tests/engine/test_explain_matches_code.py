"""``explain()`` names the kernels the generated code really calls.

Operator selection is the one place a kernel is chosen: it writes a Kernel into every node, and
``ml.compile`` binds exactly that kernel into its generated code. For the graphs chapter 7
compiles or selects and the graphs of ``benchmarks/train_step.py``, these tests read ``c.code``
and the callables bound to it and check, node by node, that

* the code calls each node's selected kernel, and nothing else (every call is one node's);
* ``explain()`` prints that kernel's name and device;
* the name is true: a run with spies on numpy's BLAS (``cblas.*``) and on every Numba loop
  (``numba.*``) sees exactly the BLAS calls and Numba loops the names promise, node by node;
  ``numpy.F`` names a kernel whose code calls numpy's ``F``; ``numpy.<op>`` is the op's own
  reference and ``view.<op>`` its numpy view.
"""

import ast
import dis
import functools
import re
import sys
import types

import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

import mlsys_lab as ml
from mlsys_lab import nn, ops
from mlsys_lab.engine import cpu_impls
from mlsys_lab.engine.passes import fusion
from mlsys_lab.engine.passes.fusion import kernels as fused_kernels
from mlsys_lab.engine.registry import get
from mlsys_lab.nn import zoo

F32 = np.float32
LINE = re.compile(r"# #(\d+) \S+ = (\S+)$")


# --- the graphs --------------------------------------------------------------------------------
def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def issue_repro():
    """The graph the issue reported: explain() said numpy.gemm while the code called cblas."""
    rng = np.random.default_rng(0)
    args = [_rand(rng, *s) for s in ((4, 3), (3, 5), (3, 5), (4, 5))]
    return ml.compile(lambda x, w, b, c: ops.sigmoid(x @ w) + c - 0.1 * (x @ b), *args), args


def chapter7_mlp():
    """Chapter 7, section 4: explain() of a small compiled MLP."""
    model = zoo.mlp((16, 32, 32, 4), seed=0)
    x = _rand(np.random.default_rng(1), 8, 16)
    return ml.compile(lambda v: model(v), x), [x]


def chapter7_residual_block():
    """Chapter 7, section 3: a ResidualBlock in eval mode, batch norm folded and fused."""
    block = zoo.ResidualBlock(4, seed=0)
    block.eval()
    x = _rand(np.random.default_rng(2), 2, 4, 8, 8)
    return ml.compile(lambda v: block(v), x), [x]


def _two_layer(x, w1, b1, w2):
    return ops.relu(x @ w1 + b1) @ w2


def chapter7_two_layer(device):
    """Chapter 7, section 2: the two-layer graph selected for every device."""
    rng = np.random.default_rng(3)
    args = [_rand(rng, 4, 8), _rand(rng, 8, 16), np.zeros(16, F32), _rand(rng, 16, 3)]
    return ml.compile(_two_layer, *args, device=device), args


def chapter7_concat100():
    """Chapter 7, section 1: a Concat of 100 inputs on the npu (its kernel takes 63)."""
    rng = np.random.default_rng(4)
    pieces = [_rand(rng, 1, 4) for _ in range(100)]
    return ml.compile(lambda *xs: ops.concatenate(list(xs), 0), *pieces, device="npu"), pieces


def chapter7_head():
    """Chapter 7, section 4: the heterogeneous MLP head on the npu."""
    rng = np.random.default_rng(5)
    args = [_rand(rng, 64, 32), _rand(rng, 32, 64, scale=0.2), np.zeros(64, F32),
            _rand(rng, 64, 10, scale=0.2)]

    def head(x, w1, b1, w2):
        return ops.softmax(ops.tanh(ops.relu(x @ w1 + b1)) @ w2, axis=-1)
    return ml.compile(head, *args, device="npu"), args


def chapter7_elementwise():
    """Chapter 7, section 1: the conv + bias + relu, linear + bias + relu and elementwise
    chains of the fusion demos, compiled on cpu."""
    rng = np.random.default_rng(6)
    args = [_rand(rng, 2, 4, 8, 8), _rand(rng, 4, 4, 3, 3, scale=0.2), _rand(rng, 1, 4, 1, 1),
            _rand(rng, 32, 16), _rand(rng, 16, 8), _rand(rng, 8), _rand(rng, 64)]

    def f(x, w, b, a, v, c, e):
        conv = ops.relu(ops.conv2d(x, w, padding=1) + b)
        return conv, ops.relu(a @ v + c), ops.tanh(ops.relu(e * 1.5 + 0.25)) * 0.5
    return ml.compile(f, *args), args


def train_step(model, x, y):
    step = ml.compile_train_step(model, ops.cross_entropy, x, y, lr=0.01)
    return step.compiled, step, (x, y)


def chapter7_train_step(kind):
    """Chapter 7, section 3: the training steps whose memory the planners compare."""
    rng = np.random.default_rng(7)
    if kind == "mlp":
        model, x = zoo.mlp((64, 128, 128, 10), seed=0), rng.standard_normal((32, 64))
    elif kind == "resnet":
        model = zoo.resnet_cnn(channels=8, blocks=2, image=8, seed=0)
        x = rng.standard_normal((16, 1, 8, 8))
    else:
        model = zoo.TransformerClassifier(dim=32, heads=4, hidden=64, seed=0)
        x = rng.standard_normal((8, 16, 32))
    return train_step(model, x.astype(F32), rng.integers(0, 10, size=x.shape[0]))


def benchmark_train_step(sizes, batch):
    """benchmarks/train_step.py: nn.Sequential of Linear + ReLU, SGD in one compiled graph."""
    rng = np.random.default_rng(0)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b, rng=i)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    x = rng.standard_normal((batch, sizes[0])).astype(F32)
    return train_step(nn.Sequential(*layers), x, rng.integers(0, sizes[-1], batch))


CASES = {
    "issue repro": issue_repro,
    "ch7 mlp": chapter7_mlp,
    "ch7 residual block": chapter7_residual_block,
    **{f"ch7 two-layer on {d}": functools.partial(chapter7_two_layer, d)
       for d in ("cpu", "cpu-numba", "cuda", "npu")},
    "ch7 concat100 on npu": chapter7_concat100,
    "ch7 head on npu": chapter7_head,
    "ch7 fusion demos": chapter7_elementwise,
    **{f"ch7 {k} train step": functools.partial(chapter7_train_step, k)
       for k in ("mlp", "resnet", "transformer")},
    "benchmark 784-256-256-10": functools.partial(benchmark_train_step, (784, 256, 256, 10), 64),
    "benchmark 784-1024-1024-10": functools.partial(benchmark_train_step,
                                                    (784, 1024, 1024, 10), 256),
}


# --- reading the generated code ----------------------------------------------------------------
def generated_calls(c):
    """``[(node, bound callable)]`` for every call in ``c.code``, in order. Every statement of
    the generated ``run`` must be an environment read/write, a ``kN(...)`` call of one node (a
    view's result assigned) or the final ``return None``."""
    exe = c.current
    tree = ast.parse(c.code)
    (fn,) = tree.body
    lines = c.code.splitlines()
    nodes = {n.id: n for n in c.graph.nodes}
    calls = []
    for stmt in fn.body:
        call = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if isinstance(call, ast.Call):
            assert isinstance(call.func, ast.Name) and re.fullmatch(r"k\d+", call.func.id), \
                ast.unparse(stmt)
            m = LINE.search(lines[stmt.lineno - 1])
            assert m, lines[stmt.lineno - 1]
            node = nodes[int(m.group(1))]
            assert node.op == m.group(2)
            calls.append((node, call.func.id, exe._run.__globals__[call.func.id]))
        else:
            assert isinstance(stmt, (ast.Assign, ast.Return)), ast.unparse(stmt)
            assert all(not isinstance(x, ast.Call) for x in ast.walk(stmt)), ast.unparse(stmt)
    return calls


def explained(c):
    """``{node id: (device, kernel name)}`` from explain()'s kernel-selection table."""
    text = c.explain()
    table = text.split("== kernel selection ==\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = {}
    for row in table[1:]:
        node, _op, dev, kernel, _reason = row.split(None, 4)
        rows[int(node.lstrip("#"))] = (dev, kernel)
    return rows


def unwrap(fn):
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def numpy_functions(fn):
    """The numpy functions a kernel's code refers to: through ``__wrapped__``, closures, ``np.F``
    loads in its bytecode, and helper functions of its own module, transitively."""
    found, stack, seen = set(), [unwrap(fn)], set()
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, np.ufunc) or (getattr(f, "__module__", None) or "").startswith("numpy"):
            found.add(getattr(f, "__name__", ""))
            continue
        if hasattr(f, "__wrapped__"):
            stack.append(f.__wrapped__)
        if not isinstance(f, types.FunctionType):
            continue
        stack += [cell.cell_contents for cell in f.__closure__ or ()
                  if callable(cell.cell_contents)]
        ins = list(dis.get_instructions(f.__code__))
        for a, b in zip(ins, ins[1:]):
            if a.opname != "LOAD_GLOBAL":
                continue
            obj = f.__globals__.get(a.argval)
            if obj is np and b.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                found.add(getattr(getattr(np, b.argval), "__name__", b.argval))
            elif isinstance(obj, types.FunctionType) and obj.__module__ == f.__module__:
                stack.append(obj)
    return found


# --- spies ----------------------------------------------------------------------------------------
class Spy:
    """Records, while installed, which node's kernel is running and each BLAS call and Numba
    loop it makes: ``events[node id]`` lists ``("cblas", dtype)`` and ``("numba", words)``."""

    def __init__(self, monkeypatch, c, calls):
        self.events, self.current = {}, None
        g = c.current._run.__globals__
        for node, name, fn in calls:
            monkeypatch.setitem(g, name, self._marker(node.id, fn))
        table = fused_kernels._cblas()
        monkeypatch.setattr(fused_kernels, "_CBLAS", [{
            dt: self._recorder(("cblas", dt.name), fn) for dt, fn in table.items()}])
        for module, prefix in self._loop_modules():
            for attr, obj in list(vars(module).items()):
                if isinstance(obj, Dispatcher):
                    words = prefix + tuple(w for w in obj.py_func.__name__.split("_") if w)
                    monkeypatch.setattr(module, attr, self._recorder(("numba", words), obj))
        for key, loop in list(fusion.KERNEL_CACHE.items()):  # the generated loops
            monkeypatch.setitem(fusion.KERNEL_CACHE, key,
                                self._recorder(("numba", ("fused", "elementwise")), loop))

    @staticmethod
    def _loop_modules():
        """Modules whose Numba loops kernels call: CPU impls, fused ops, the matmul ladder."""
        yield cpu_impls, ()
        yield fused_kernels, ()
        for name in ("conv_gemm", "winograd", "pooling"):  # the convolution and pooling kernels
            if f"mlsys_lab.kernels.{name}" in sys.modules:
                yield sys.modules[f"mlsys_lab.kernels.{name}"], ()
        if "mlsys_lab.kernels.cpu" in sys.modules:
            yield sys.modules["mlsys_lab.kernels.cpu"], ("matmul",)

    def _marker(self, node_id, fn):
        def run(*args, **kwargs):
            self.current = node_id
            self.events.setdefault(node_id, [])
            try:
                return fn(*args, **kwargs)
            finally:
                self.current = None
        return run

    def _recorder(self, event, fn):
        def run(*args, **kwargs):
            if self.current is not None:
                self.events[self.current].append(event)
            return fn(*args, **kwargs)
        return run


def _name_parts(name):
    """``"numpy.matmul+add(out=)"`` -> ``[("numpy", "matmul"), ("numpy", "add")]``."""
    parts, lib = [], None
    for part in name.split("+"):
        if "." in part:
            lib, part = part.split(".", 1)
        parts.append((lib, part.removesuffix("(out=)")))
    return parts


def check_name_is_true(node, kernel, events):
    """The kernel's name against its code and what it did in the spied run."""
    op = get(node.op)
    where = f"node #{node.id} {node.op} named {kernel.name}"
    blas = [e for e in events if e[0] == "cblas"]
    loops = [e[1] for e in events if e[0] == "numba"]
    if kernel.name == f"view.{node.op}":
        assert kernel.out_fn is op.view and not events, where
        return
    if kernel.name == f"numpy.{node.op}":  # the op's own reference kernel
        assert unwrap(kernel.out_fn).__wrapped__ is op.compute, where
        assert not events, f"{where} ran {events}"
        return
    parts = _name_parts(kernel.name)
    libs = {lib for lib, _ in parts}
    if "cblas" in libs:
        ((_, fn),) = parts
        dtype = {"s": "float32", "d": "float64"}[fn[0]]
        assert fn[1:] == "gemm" and blas == [("cblas", dtype)], f"{where} made BLAS calls {blas}"
    else:
        assert not blas, f"{where} called BLAS {blas}"
    if "numba" in libs:
        for lib, fn in parts:
            if lib == "numba":
                words = set(fn.split("_"))
                assert any(words <= set(w) for w in loops), f"{where} ran Numba loops {loops}"
    elif libs & {"numpy", "cblas"}:
        assert not loops, f"{where} ran Numba loops {loops}"
    for lib, fn in parts:
        if lib == "numpy":
            assert fn in numpy_functions(kernel.out_fn), f"{where}: its code never calls {fn}"
    if libs & {"npu"}:  # the simulated npu runs the op's numpy reference
        assert not events, f"{where} ran {events}"


# --- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    return request.param, CASES[request.param]()


def _run(c, step, args):
    if step is not None:  # a training step: parameters updated in place, as the benchmark runs
        return step(*args)
    return c(*args, profile=False)


def _unpack(made):
    return made if len(made) == 3 else (made[0], None, made[1])


def test_generated_code_calls_exactly_the_selected_kernels(compiled):
    name, made = compiled
    c, _, _ = _unpack(made)
    calls = generated_calls(c)
    assert sorted(n.id for n, _, _ in calls) == sorted(n.id for n in c.graph.nodes), name
    for node, _, bound in calls:
        kernel = node.meta["kernel"]
        assert unwrap(bound) is kernel.out_fn, f"{name}: node #{node.id} {node.op}"
        if isinstance(bound, functools.partial):
            assert bound.keywords == node.attrs and not bound.args
        else:
            assert not node.attrs


def test_explain_names_the_selected_kernel_of_every_node(compiled):
    name, made = compiled
    c, _, _ = _unpack(made)
    rows = explained(c)
    assert set(rows) == {n.id for n in c.graph.nodes}, name
    for node in c.graph.nodes:
        assert rows[node.id] == (node.meta["device"], node.meta["kernel"].name), \
            f"{name}: node #{node.id} {node.op}"


def test_each_kernel_does_what_its_name_says(compiled, monkeypatch):
    name, made = compiled
    c, step, args = _unpack(made)
    want = _run(c, step, args)  # compiles every lazily compiled loop before the spies go in
    calls = generated_calls(c)
    spy = Spy(monkeypatch, c, calls)
    got = _run(c, step, args)
    monkeypatch.undo()
    if step is None:
        for a, b in zip(want if isinstance(want, tuple) else (want,),
                        got if isinstance(got, tuple) else (got,)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # the spies changed nothing
    assert set(spy.events) == {n.id for n, _, _ in calls}, name  # every node ran
    for node, _, _ in calls:
        check_name_is_true(node, node.meta["kernel"], spy.events[node.id])


def test_the_issue_repro_names_cblas():
    c, _ = issue_repro()
    (gemm,) = [n for n in c.graph.nodes if n.op == "gemm"]
    assert explained(c)[gemm.id] == ("cpu", "cblas.sgemm")
    assert "numpy.gemm" not in c.explain()


def test_kernels_the_issue_named_are_the_numba_ones():
    c, _, _ = benchmark_train_step((784, 256, 256, 10), 64)
    rows = explained(c)
    names = {n.op: rows[n.id][1] for n in c.graph.nodes}
    assert names["relu_grad"] == "numba.relu_grad"
    assert names["cross_entropy"] == "numba.cross_entropy"
    assert names["cross_entropy_grad"] == "numba.cross_entropy_grad"
    assert names["fused_linear"] in ("numpy.matmul+numba.bias_relu", "numpy.matmul+add(out=)")
    assert names["gemm"] == "cblas.sgemm" and names["sum_accumulate"] == "numba.sum_accumulate"


# --- the registry is the only table of kernels --------------------------------------------------
def test_the_npu_kernels_are_impls_of_their_ops_and_the_concat_limit_is_accepts():
    from mlsys_lab.engine.registry import AVal
    from mlsys_lab.engine.selection import device

    device("npu")
    for op in ("matmul", "conv2d", "add", "relu", "mul"):
        assert [k.name for k in get(op).impls["npu"]] == [f"npu.{op}_fp16"]
    (concat,) = get("concatenate").impls["npu"]
    piece, f32 = AVal((1, 4), np.dtype(F32)), np.dtype(F32)
    assert concat.name == "npu.concat63"
    assert concat.accepts([piece] * 63, AVal((63, 4), f32), {"axis": 0}) is None
    assert concat.accepts([piece] * 64, AVal((64, 4), f32), {"axis": 0}) == \
        "64 inputs > limit 63"


def test_a_kernel_registered_for_an_op_is_chosen_run_and_named():
    from mlsys_lab.engine.registry import REGISTRY, register_impl

    calls = []

    def twice_into(out, x):
        calls.append(out.shape)
        np.multiply(x, 2, out=out)

    twice = ml.custom_op("test_twice", compute=lambda x: x * 2,
                         infer=lambda x: x, replace=True)
    try:
        register_impl("test_twice", "cpu", twice_into, name="numpy.multiply(out=)",
                      accepts=lambda avals, out, attrs: None if out.shape[0] > 1 else "short")
        x = np.arange(6, dtype=F32).reshape(3, 2)
        c = ml.compile(lambda v: twice(v) + 1.0, x, passes=None)
        (node,) = [n for n in c.graph.nodes if n.op == "test_twice"]
        assert explained(c)[node.id] == ("cpu", "numpy.multiply(out=)")
        np.testing.assert_array_equal(c(x, profile=False), x * 2 + 1)
        assert calls == [(3, 2)]
        short = ml.compile(lambda v: twice(v) + 1.0, x[:1], passes=None)
        (node,) = [n for n in short.graph.nodes if n.op == "test_twice"]
        assert explained(short)[node.id] == ("cpu", "numpy.test_twice")
        assert "numpy.multiply(out=) rejects: short" in node.meta["choice"].reason
        np.testing.assert_array_equal(short(x[:1]), x[:1] * 2 + 1)
        assert calls == [(3, 2)]
    finally:
        REGISTRY.pop("test_twice", None)


def test_compiled_refuses_a_graph_without_selected_kernels():
    from mlsys_lab.engine.compiler import Executable

    x = np.ones((2, 2), F32)
    c = ml.compile(lambda v: ops.relu(v), x)
    exe = c.current
    exe.graph.nodes[0].meta.pop("kernel")
    with pytest.raises(ml.GraphError, match="no selected kernel"):
        Executable._build(exe)


def test_fused_kernel_writes_a_strided_donated_input():
    """A donated input that numpy cannot flatten without a copy (every other row) receives the
    fused loop's result (it used to be written into a flattened copy and lost)."""
    x = np.arange(48, dtype=F32).reshape(8, 6) - 20
    c = ml.compile(lambda v: ops.tanh(ops.relu(v * 0.1 + 1.0)), x[:4, :3].copy(),
                   donate=[(0, 0)])
    assert c.donated and [n.op for n in c.graph.nodes] == ["fused_elementwise"]
    for profile in (False, True):
        base = x.copy()
        strided = base[::2, :3]
        want = np.tanh(np.maximum(strided * F32(0.1) + 1, 0))
        np.testing.assert_allclose(c(strided, profile=profile), want, rtol=1e-6, atol=1e-7)
