"""ONNX export and import (mlsys_lab.deploy), checked against onnxruntime.

* every op with an export mapping, on random shapes and attributes (hypothesis): the exported
  model run by onnxruntime matches mlsys_lab (rtol/atol 1e-5, float32), and importing it back
  gives the same graph (same ops, attributes, shapes, constants) or, for the few ops whose ONNX
  form is several nodes that import as several ops, a graph computing the same values;
* random traced programs (``random_graph``) round-trip the same way;
* whole models: an MLP and a ResNet-style CNN with batch norm (eval mode), and the "light" model
  zoo inside the onnx wheel (SqueezeNet, ShuffleNet, Inception v1 with LRN) with random weights,
  through the graph interpreter and ``ml.compile``, against onnxruntime;
* clear errors: truncated, corrupted and missing files, an unsupported op, attribute, attribute
  value or dtype, a symbolic dimension, an input needed at import time, an op without export;
* graph files (``save_graph`` / ``load_graph``): traced, optimised, training and random graphs
  load as the same graph and compute the same values, without pickle; bad files are refused.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import mlsys_lab as ml  # noqa: E402
from mlsys_lab.deploy import (  # noqa: E402
    StaticInputError,
    export_onnx,
    import_onnx,
    load_graph,
    save_graph,
    support_table,
)
from mlsys_lab.deploy.onnx import exportable_ops  # noqa: E402
from mlsys_lab.engine.graph import Graph, Node, Value  # noqa: E402
from mlsys_lab.engine.interpreter import Interpreter  # noqa: E402
from mlsys_lab.engine.random_graphs import random_graph  # noqa: E402
from mlsys_lab.errors import (  # noqa: E402
    ArgumentError,
    CheckpointError,
    DTypeError,
    GraphError,
    UnknownNameError,
)
from mlsys_lab.nn import zoo  # noqa: E402

F32 = np.float32
SETTINGS = dict(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run_onnxruntime(model, args):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, args)))


def run_graph(graph, args):
    return [np.asarray(o) for o in Interpreter(graph).run(*args)]


def assert_close(got, want, tol=1e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, got.shape,
                                                                 want.dtype, want.shape)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def _same_attr(a, b):
    if isinstance(a, Graph):
        assert_same_graph(a, b)
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return type(a) is type(b) and a == b if not isinstance(a, float) else a == b


def assert_same_graph(a, b):
    """Same ops in the same order, same attributes, shapes, dtypes, constants and wiring."""
    assert [n.op for n in a.nodes] == [n.op for n in b.nodes], (a, b)
    assert [(v.shape, v.dtype) for v in a.inputs] == [(v.shape, v.dtype) for v in b.inputs]
    same = {id(x): id(y) for x, y in zip(a.inputs, b.inputs)}
    for na, nb in zip(a.nodes, b.nodes):
        assert na.attrs.keys() == nb.attrs.keys() and all(
            _same_attr(na.attrs[k], nb.attrs[k]) for k in na.attrs), (na, nb)
        assert len(na.inputs) == len(nb.inputs)
        for x, y in zip(na.inputs, nb.inputs):
            if x in a.consts:
                assert y in b.consts, (na, nb)
                assert a.consts[x].dtype == b.consts[y].dtype
                np.testing.assert_array_equal(a.consts[x], b.consts[y])
            else:
                assert same[id(x)] == id(y), (na, nb)
        assert (na.output.shape, na.output.dtype) == (nb.output.shape, nb.output.dtype)
        same[id(na.output)] = id(nb.output)
    assert [same.get(id(v)) for v in a.outputs] == [id(v) for v in b.outputs]


def check_round_trip(fn, args, exact=True, tol=1e-5):
    """Export ``fn`` on ``args``, run it in onnxruntime, import it back and compare."""
    graph = ml.trace(fn, *args)
    model = export_onnx(graph)
    want = run_graph(graph, args)
    for got, ref in zip(run_onnxruntime(model, args), want):
        assert_close(got, ref, tol)
    back = import_onnx(model)
    if exact:
        assert_same_graph(graph, back)
    for got, ref in zip(run_graph(back, args), want):
        assert_close(got, ref, tol)
    return graph, back


# --- per-op cases (random shapes and attributes) ------------------------------------------------
def _shape(data, min_dims=1, max_dims=4, max_side=5):
    n = data.draw(st.integers(min_dims, max_dims))
    return tuple(data.draw(st.integers(1, max_side)) for _ in range(n))


def _rng(data):
    return np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))


def _partner(data, shape):
    """A shape that broadcasts with ``shape`` (some dims 1, maybe fewer leading dims)."""
    dims = [1 if data.draw(st.booleans()) else d for d in shape]
    return tuple(dims[data.draw(st.integers(0, len(dims) - 1)):]) if dims else ()


def _unary(name, positive=False):
    def case(data):
        rng = _rng(data)
        x = rng.uniform(0.1 if positive else -3, 3, _shape(data)).astype(F32)
        return getattr(ml.ops, name), (x,)
    return case


def _binary(name, ties=False, positive=False):
    def case(data):
        rng = _rng(data)
        shape = _shape(data)
        lo = 0.5 if positive else -3
        a = rng.uniform(lo, 3, shape).astype(F32)
        b = rng.uniform(lo, 3, _partner(data, shape)).astype(F32)
        if ties:
            a, b = np.round(a), np.round(b)
        if data.draw(st.booleans()):
            a, b = b, a
        return getattr(ml.ops, name), (a, b)
    return case


def _pow(data):
    rng = _rng(data)
    shape = _shape(data)
    return ml.ops.pow, (rng.uniform(0.5, 2, shape).astype(F32),
                        rng.uniform(-2, 2, _partner(data, shape)).astype(F32))


def _where(data):
    rng = _rng(data)
    shape = _shape(data)
    c, a, b = (rng.standard_normal(s).astype(F32) for s in (shape, _partner(data, shape),
                                                           _partner(data, shape)))
    return (lambda c, a, b: ml.ops.where(c > 0, a, b)), (c, a, b)


def _cast(data):
    dtype = data.draw(st.sampled_from(["int32", "int64", "float64", "float16", "bool", "uint8"]))
    x = _rng(data).uniform(0, 100, _shape(data)).astype(F32)
    return (lambda x: ml.ops.cast(x, dtype)), (x,)


def _reshape(data):
    shape = _shape(data)
    kind = data.draw(st.sampled_from(["flat", "reverse", "one", "pair"]))
    target = {"flat": (-1,), "reverse": shape[::-1], "one": (1,) + shape,
              "pair": (shape[0], -1)}[kind]
    return (lambda x: ml.ops.reshape(x, target)), (_rng(data).standard_normal(shape).astype(F32),)


def _transpose(data):
    shape = _shape(data)
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    return (lambda x: ml.ops.transpose(x, perm)), (_rng(data).standard_normal(shape).astype(F32),)


def _broadcast_to(data):
    target = _shape(data, max_dims=3)
    shape = _partner(data, target)
    lead = data.draw(st.integers(0, 2))
    x = _rng(data).standard_normal(shape).astype(F32)
    return (lambda x: ml.ops.broadcast_to(x, (lead + 1,) * bool(lead) + target)), (x,)


def _reduction(name, ties=False):
    def case(data):
        shape = _shape(data)
        axes = data.draw(st.one_of(st.none(), st.lists(st.integers(0, len(shape) - 1),
                                                        min_size=1, unique=True)))
        keep = data.draw(st.booleans())
        x = _rng(data).standard_normal(shape).astype(F32)
        return (lambda x: getattr(ml.ops, name)(x, None if axes is None else tuple(axes),
                                                keepdims=keep)), (np.round(x) if ties else x,)
    return case


def _argmax(data):
    shape = _shape(data)
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    x = np.round(_rng(data).standard_normal(shape)).astype(F32)  # ties: the first one wins
    return (lambda x: ml.ops.argmax(x, axis)), (x,)


def _concatenate(data):
    shape = _shape(data)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = _rng(data)
    parts = []
    for _ in range(data.draw(st.integers(2, 3))):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 3))
        parts.append(rng.standard_normal(s).astype(F32))
    return (lambda *xs: ml.ops.concatenate(xs, axis)), tuple(parts)


def _stack(data):
    shape = _shape(data, max_dims=3)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    rng = _rng(data)
    parts = tuple(rng.standard_normal(shape).astype(F32) for _ in range(data.draw(
        st.integers(2, 3))))
    return (lambda *xs: ml.ops.stack(xs, axis)), parts


def _index_part(data, n):
    if data.draw(st.booleans()):
        return data.draw(st.integers(-n, n - 1))
    bound = st.one_of(st.none(), st.integers(-n - 1, n + 1))
    return slice(data.draw(bound), data.draw(bound), data.draw(st.sampled_from([None, 2, -1, -2])))


def _getitem(data):
    shape = _shape(data)
    index = tuple(_index_part(data, n) for n in shape[:data.draw(st.integers(1, len(shape)))])
    x = _rng(data).standard_normal(shape).astype(F32)
    return (lambda x: ml.ops.getitem(x, index)), (x,)


def _take(data):
    shape = _shape(data)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = _rng(data)
    n = shape[axis]
    idx = rng.integers(-n, n, _shape(data, min_dims=0, max_dims=2)).astype(np.int64)
    return (lambda x, i: ml.ops.take(x, i, axis)), (rng.standard_normal(shape).astype(F32), idx)


def _embedding(data):
    rng = _rng(data)
    rows, dim = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4))
    ids = rng.integers(0, rows, _shape(data, min_dims=0, max_dims=2)).astype(
        data.draw(st.sampled_from([np.int64, np.int32])))
    return (lambda w, i: ml.ops.embedding(w, i)), (rng.standard_normal((rows, dim)).astype(F32),
                                                   ids)


def _pad(data):
    shape = _shape(data)
    widths = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    value = data.draw(st.sampled_from([0.0, 1.5, -2.0]))
    x = _rng(data).standard_normal(shape).astype(F32)
    return (lambda x: ml.ops.pad(x, widths, value)), (x,)


def _matmul(data):
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    batch = _shape(data, min_dims=0, max_dims=2, max_side=3)
    rng = _rng(data)
    a = rng.standard_normal(batch + (m, k)).astype(F32)
    b = rng.standard_normal(_partner(data, batch) + (k, n)).astype(F32)
    return ml.ops.matmul, (a, b)


def _softmax(name):
    def case(data):
        shape = _shape(data)
        axis = data.draw(st.integers(-len(shape), len(shape) - 1))
        x = (_rng(data).standard_normal(shape) * 3).astype(F32)
        return (lambda x: getattr(ml.ops, name)(x, axis)), (x,)
    return case


def _conv2d(data):
    groups = data.draw(st.sampled_from([1, 1, 2]))
    c, o = groups * data.draw(st.integers(1, 3)), groups * data.draw(st.integers(1, 3))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    stride = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    padding = (data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2)))
    dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    h = data.draw(st.integers(dilation[0] * (kh - 1) + 1, 8))
    w = data.draw(st.integers(dilation[1] * (kw - 1) + 1, 8))
    rng = _rng(data)
    x = rng.standard_normal((data.draw(st.integers(1, 2)), c, h, w)).astype(F32)
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype(F32)
    return (lambda x, wt: ml.ops.conv2d(x, wt, stride=stride, padding=padding,
                                        dilation=dilation, groups=groups)), (x, wt)


def _conv2d_grad_input(data):
    """A transposed convolution: the input gradient of a random conv2d, with an output size
    the stride leaves free (ONNX's output_padding)."""
    from mlsys_lab.engine.ops_nn import conv2d_grad_input

    fn, (x, wt) = _conv2d(data)
    y = ml.trace(fn, x, wt).nodes[0]
    attrs = {k: v for k, v in y.attrs.items()}
    extra = [data.draw(st.integers(0, s - 1)) for s in attrs["stride"]]
    shape = x.shape[:2] + tuple(n + e for n, e in zip(x.shape[2:], extra))
    if ml.trace(fn, np.zeros(shape, F32), wt).nodes[0].output.shape != y.output.shape:
        shape = x.shape
    g = _rng(data).standard_normal(y.output.shape).astype(F32)
    return (lambda g, wt: conv2d_grad_input(g, wt, shape, **attrs)), (g, wt)


def _pool(name):
    def case(data):
        k = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
        stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
        padding = tuple(data.draw(st.integers(0, kk // 2)) for kk in k)
        shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)),
                 data.draw(st.integers(k[0], 7)), data.draw(st.integers(k[1], 7)))
        x = _rng(data).standard_normal(shape).astype(F32)
        return (lambda x: getattr(ml.ops, name)(x, k, stride, padding)), (x,)
    return case


def _one_hot(data):
    n = data.draw(st.integers(1, 5))
    labels = _rng(data).integers(0, n, _shape(data, max_dims=2)).astype(np.int64)
    return (lambda t: ml.ops.one_hot(t, n)), (labels,)


def _cross_entropy(data):
    n, c = data.draw(st.integers(1, 5)), data.draw(st.integers(2, 6))
    rng = _rng(data)
    return ml.ops.cross_entropy, (rng.standard_normal((n, c)).astype(F32),
                                  rng.integers(0, c, n).astype(np.int64))


def _mse(data):
    shape = _shape(data)
    rng = _rng(data)
    return ml.ops.mse_loss, tuple(rng.standard_normal(shape).astype(F32) for _ in range(2))


CASES = {
    **{name: _unary(name) for name in ("abs", "cos", "exp", "neg", "relu", "sigmoid", "sign",
                                        "sin", "tanh", "identity")},
    "log": _unary("log", positive=True), "sqrt": _unary("sqrt", positive=True),
    **{name: _binary(name) for name in ("add", "sub", "mul", "maximum", "minimum")},
    "div": _binary("div", positive=True), "pow": _pow,
    **{name: _binary(name, ties=True) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    "where": _where, "cast": _cast, "reshape": _reshape, "transpose": _transpose,
    "broadcast_to": _broadcast_to, "sum": _reduction("sum"), "mean": _reduction("mean"),
    "max": _reduction("max", ties=True), "argmax": _argmax, "concatenate": _concatenate,
    "stack": _stack, "getitem": _getitem, "take": _take, "embedding": _embedding, "pad": _pad,
    "matmul": _matmul,
    "softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax"), "conv2d": _conv2d,
    "conv2d_grad_input": _conv2d_grad_input,
    "max_pool2d": _pool("max_pool2d"), "avg_pool2d": _pool("avg_pool2d"), "one_hot": _one_hot,
    "cross_entropy": _cross_entropy, "mse_loss": _mse,
}
#: Ops whose import gives a graph that computes the same values but is not the same graph,
#: with the reason.
NOT_EXACT = {
    "one_hot": "ONNX OneHot counts negative indices from the end: the import adds that wrap",
    "embedding": "ONNX has no lookup that refuses an id outside the table: Gather imports as "
                 "take",
}


#: Ops whose round trip is checked elsewhere, with where: a QDQ model needs calibrated scales,
#: which the random cases here do not make.
EXPORT_ONLY = {
    "quantize_linear": "tests/deploy/test_deploy_qdq.py: export, import and run within one step of "
                       "onnxruntime",
    "dequantize_linear": "the same, with quantize_linear",
    "scaled_dot_product_attention": "tests/deploy/test_onnx_attention.py: opsets 18 and 23 "
                                    "against onnxruntime and the reference evaluator, imported "
                                    "back as one node",
}


def test_every_exportable_op_has_a_round_trip_case():
    missing = set(exportable_ops()) - set(CASES) - {"copy"} - set(EXPORT_ONLY)
    assert not missing, f"exportable ops without a round-trip case: {sorted(missing)}"


@pytest.mark.parametrize("op_name", sorted(CASES))
@settings(**SETTINGS)
@given(data=st.data())
def test_op_round_trips_through_onnx_and_onnxruntime(op_name, data):
    fn, args = CASES[op_name](data)
    graph, _ = check_round_trip(fn, args, exact=op_name not in NOT_EXACT)
    assert any(n.op == op_name for n in graph.nodes)


def test_copy_exports_as_identity():
    a = Value("a", (2, 3), F32)
    out = Value("b", (2, 3), F32)
    graph = Graph([a], [Node("copy", [a], {"src": "cpu", "dst": "cpu"}, [out])], [out])
    x = np.arange(6, dtype=F32).reshape(2, 3)
    model = export_onnx(graph)
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    assert_close(run_onnxruntime(model, [x])[0], x)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000))
def test_random_programs_round_trip(seed):
    graph, inputs = random_graph(seed, n_nodes=10)
    model = export_onnx(graph)
    want = run_graph(graph, inputs)
    for got, ref in zip(run_onnxruntime(model, inputs), want):
        assert_close(got, ref)
    back = import_onnx(model)
    assert_same_graph(graph, back)


def test_getitem_forms_with_ellipsis_none_and_index_arrays():
    x = np.arange(60, dtype=F32).reshape(3, 4, 5)
    for index in [(Ellipsis, 1), (None, slice(1, 3)), (slice(None), [2, 0, 2]), (1, None, -1)]:
        check_round_trip(lambda x, index=index: x[index], (x,), exact=False)


def test_opset_17_writes_reduction_axes_as_attributes():
    x = np.random.default_rng(6).standard_normal((2, 3, 4)).astype(F32)

    def fn(x):
        return ml.ops.softmax(ml.ops.mean(x, 1, keepdims=True) + ml.ops.max(x, (0, 2)).sum(), -1)

    model = export_onnx(fn, (x,), opset=17)
    assert model.opset_import[0].version == 17
    assert_close(run_onnxruntime(model, [x])[0], fn(ml.tensor(x)).numpy())
    assert_same_graph(ml.trace(fn, x), import_onnx(model))
    with pytest.raises(ArgumentError, match="opset 16 is too old"):
        export_onnx(fn, (x,), opset=16)


def test_mixed_dtype_arithmetic_casts_for_onnx():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3)
    check_round_trip(lambda a, b: a * b + ml.ops.div(a, a + 1), (a, b), exact=False)
    check_round_trip(lambda a: ml.ops.sum(a, 1), (a,), exact=False)  # int32 sums to int64


# --- models ------------------------------------------------------------------------------------
def test_mlp_matches_onnxruntime_and_compiles_after_import(tmp_path):
    model = zoo.mlp((20, 32, 16, 5), seed=3)
    model.eval()
    x = np.random.default_rng(0).standard_normal((7, 20)).astype(F32)
    path = tmp_path / "mlp.onnx"
    export_onnx(model, (x,), path)
    want = model(ml.tensor(x)).numpy()
    assert_close(run_onnxruntime(onnx.load(str(path)), [x])[0], want)
    graph = import_onnx(path)
    compiled = ml.compile(graph, x)
    assert_close(np.asarray(compiled(x)), want)
    assert any(n.op.startswith("fused") for n in compiled.current.graph.nodes)


def test_cnn_with_batch_norm_and_dropout_in_eval_mode():
    cnn = zoo.resnet_cnn(channels=4, blocks=1, seed=1)
    for m in cnn.modules():  # non-trivial running statistics
        if isinstance(m, ml.nn.BatchNorm2d):
            m.running_mean[:] = np.linspace(-0.5, 0.5, m.num_features)
            m.running_var[:] = np.linspace(0.5, 2.0, m.num_features)
    net = ml.nn.Sequential(cnn, ml.nn.Dropout(0.3))
    net.eval()
    x = np.random.default_rng(1).standard_normal((3, 1, 8, 8)).astype(F32)
    want = net(ml.tensor(x)).numpy()
    model = export_onnx(net, (x,))
    assert_close(run_onnxruntime(model, [x])[0], want)
    graph = import_onnx(model)
    assert_close(run_graph(graph, [x])[0], want)
    assert_close(np.asarray(ml.compile(graph, x)(x)), want)


def test_training_mode_dropout_does_not_export():
    net = ml.nn.Sequential(ml.nn.Linear(4, 4), ml.nn.Dropout(0.5))
    with pytest.raises(UnknownNameError, match=r"node #\d+ .*= (dropout|rng_seed).*eval mode"):
        export_onnx(net, (np.ones((2, 4), F32),))


def _randomized(model, seed=0):
    """The light models' weights are ConstantOfShape fills of 0.02, which make every logit
    equal; give each weight He-scaled random values instead (biases and batch-norm shifts small,
    batch-norm scales and variances near 1) so that a wrong op shows. The logits become a
    second output."""
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    readers = {name: (n.op_type, i) for n in g.node for i, name in enumerate(n.input)}
    kept, made = [], []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            reader = readers.get(node.output[0])
            if len(shape) > 1:
                arr = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
            elif reader in (("BatchNormalization", 1), ("BatchNormalization", 4)):
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = rng.uniform(-0.1, 0.1, shape)
            made.append(numpy_helper.from_array(arr.astype(F32), node.output[0]))
            g.input.append(_info(node.output[0], list(shape)))  # IR 3: initializers are inputs
        else:
            kept.append(node)
    del g.node[:]
    g.node.extend(kept)
    read = {name for n in g.node for name in n.input} | {name.name for name in made}
    inits = [t for t in g.initializer if t.name in read] + made
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name in read]
    del g.input[:]
    g.input.extend(inputs)
    logits = next(n for n in g.node if n.op_type == "Softmax").input[0]
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    g.output.append(next(v for v in inferred if v.name == logits))  # the logits, too
    return model


def assert_close_to_scale(got, want):
    """Within rtol 1e-4 and 1e-5 of the output's largest magnitude (float32 sums of
    thousands of terms)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "inception_v1"])
def test_light_zoo_model_matches_onnxruntime(name):
    model = _randomized(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")))
    graph = import_onnx(model)
    x = np.random.default_rng(2).standard_normal(graph.inputs[0].shape).astype(F32)
    want = run_onnxruntime(model, [x])
    assert np.std(want[1]) > 0.1  # the logits differ: the check is not vacuous
    for got, ref in zip(run_graph(graph, [x]), want):
        assert_close_to_scale(got, ref)
    if name == "squeezenet":
        compiled = ml.compile(graph, x)
        for got, ref in zip(compiled(x), want):
            assert_close_to_scale(got, ref)


def test_light_zoo_model_imports_as_stored():
    graph = import_onnx(os.path.join(LIGHT, "light_squeezenet.onnx"))
    assert graph.inputs[0].name == "data_0" and graph.inputs[0].shape == (1, 3, 224, 224)
    ops = [n.op for n in graph.nodes]
    assert ops.count("conv2d") == 26 and ops.count("concatenate") == 8
    assert ops.count("identity") == 1  # the Dropout, in inference
    # the ConstantOfShape weights and the reshaped biases are constants, not nodes
    assert not [n for n in graph.nodes if all(v in graph.consts for v in n.inputs)]


# --- errors ------------------------------------------------------------------------------------
def _tiny_model():
    x = np.ones((2, 3), F32)
    return export_onnx(lambda x: ml.ops.relu(x) * 2.0, (x,))


def test_truncated_and_corrupted_files_are_refused(tmp_path):
    data = _tiny_model().SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.onnx"):
        import_onnx(cut)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xfe not an onnx model at all" * 3)
    with pytest.raises(CheckpointError, match="not an ONNX model|no ONNX graph|not valid"):
        import_onnx(junk)
    with pytest.raises(CheckpointError, match="no file"):
        import_onnx(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError):
        import_onnx(empty)


def test_every_truncation_of_a_model_is_refused():
    data = _tiny_model().SerializeToString()
    for cut in range(len(data)):
        with pytest.raises(CheckpointError):
            import_onnx(data[:cut])


def _flipped(data, seed):
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for _ in range(rng.integers(1, 4)):
        out[rng.integers(len(out))] = rng.integers(256)
    return bytes(out)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1))
def test_corrupted_models_raise_library_errors_only(seed):
    x = np.ones((1, 1, 4, 4), F32)
    data = export_onnx(lambda x: ml.ops.relu(ml.ops.conv2d(x, np.ones((2, 1, 2, 2), F32))).sum(
        (1,)), (x,)).SerializeToString()
    try:
        import_onnx(_flipped(data, seed))
    except ml.MLSysError:
        pass  # a foreign exception (KeyError, UnicodeDecodeError, ...) fails the test


def _model(nodes, inputs, outputs, opset=18, inits=()):
    return helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _info(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_an_unsupported_op_is_named_with_its_node():
    model = _model([helper.make_node("Erf", ["x"], ["y"], name="my_erf")], [_info("x", [2])],
                   [_info("y", [2])])
    with pytest.raises(UnknownNameError, match=r"node #0 Erf 'my_erf'.*'Erf'.*Conv"):
        import_onnx(model)


def test_an_unsupported_attribute_is_named():
    model = _model([helper.make_node("Reshape", ["x"], ["y"], shape=[3, 2])],
                   [_info("x", [2, 3])], [_info("y", [3, 2])], opset=4)
    with pytest.raises(ArgumentError, match=r"Reshape.*attribute 'shape' is not supported"):
        import_onnx(model)
    pad = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="mirror_odd")],
                 [_info("x", [2, 3])], [_info("y", [4, 5])],
                 inits=[numpy_helper.from_array(np.ones(4, np.int64), "p")])
    with pytest.raises(ArgumentError, match=r"node #0 Pad.*mode 'mirror_odd'"):
        import_onnx(pad)


def test_unsupported_dtype_and_symbolic_dimension():
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [_info("x", [2], TensorProto.STRING)], [_info("y", [2], TensorProto.STRING)])
    with pytest.raises(DTypeError, match="dtype object is not supported"):
        import_onnx(model)
    batch = _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", ["N", 3])],
                   [_info("y", ["N", 3])])
    with pytest.raises(GraphError, match=r"symbolic dimension 'N'.*input_shapes"):
        import_onnx(batch)
    graph = import_onnx(batch, input_shapes={"x": (4, 3)})
    assert graph.inputs[0].shape == (4, 3)


def test_an_input_needed_at_import_time_is_named_and_can_be_bound():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [_info("x", [2, 3]), _info("s", [2], TensorProto.INT64)], [_info("y", [3, 2])])
    with pytest.raises(StaticInputError, match=r"static_inputs=\{'s'") as info:
        import_onnx(model)
    assert info.value.input_name == "s"
    graph = import_onnx(model, static_inputs={"s": np.array([3, 2])})
    x = np.arange(6, dtype=F32).reshape(2, 3)
    assert_close(run_graph(graph, [x])[0], x.reshape(3, 2))


def test_a_declared_output_type_that_disagrees_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", [2, 3])],
                   [_info("y", [3, 2])])
    with pytest.raises(GraphError, match=r"output 'y' is declared with shape \[3, 2\]"):
        import_onnx(model)


def _constant_of_shape(n):
    shape = numpy_helper.from_array(np.array([n, n], np.int64), "shape")
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    return _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="big_fill",
                                    value=fill)], [], [_info("y", [n, n])], inits=[shape])


def _expand_then_add(n):
    shape = numpy_helper.from_array(np.array([n, n], np.int64), "shape")
    return _model([helper.make_node("Expand", ["x", "shape"], ["wide"], name="spread"),
                   helper.make_node("Add", ["wide", "x"], ["y"], name="big_add")],
                  [_info("x", [1, 1])], [_info("y", [n, n])], inits=[shape])


def test_a_constant_too_big_for_memory_is_refused_at_import_naming_the_node(monkeypatch):
    """Issue 26.7: ConstantOfShape of 10^7 x 10^7 floats raised numpy's bare MemoryError."""
    from mlsys_lab.engine import interpreter

    monkeypatch.setattr(interpreter, "MEMORY_LIMIT", 2**40)  # as on a machine with 1 TiB
    with pytest.raises(ml.OutOfMemoryError, match=(
            r"ONNX node #0 ConstantOfShape 'big_fill': cannot allocate shape \(10000000, "
            r"10000000\) of float32: 400,000,000,000,000 bytes .*more than this machine's "
            r"1,099,511,627,776 bytes")):
        import_onnx(_constant_of_shape(10**7))
    # no limit known: numpy's own MemoryError (4e18 bytes: no address space holds it) is named
    monkeypatch.setattr(interpreter, "MEMORY_LIMIT", None)
    with pytest.raises(ml.OutOfMemoryError, match=(
            r"ConstantOfShape 'big_fill': cannot allocate shape \(1000000000, 1000000000\) of "
            r"float32: 4,000,000,000,000,000,000 bytes")):
        import_onnx(_constant_of_shape(10**9))
    monkeypatch.undo()
    assert import_onnx(_constant_of_shape(3)).consts  # a small one still imports
    negative = _constant_of_shape(3)
    negative.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([2, -1]), "shape"))
    with pytest.raises(ArgumentError, match=r"ConstantOfShape 'big_fill'.*negative dimension"):
        import_onnx(negative)


def test_a_node_too_big_for_memory_is_refused_when_run_naming_the_node(monkeypatch):
    """Issue 26.7: the graph runners raised OpError (or numpy's MemoryError) for an output
    that cannot be allocated; it is an OutOfMemoryError naming the node, its ONNX name, the
    shape and the bytes, refused before allocating when it exceeds the machine's memory."""
    from mlsys_lab.deploy.passes import run_numpy
    from mlsys_lab.engine import interpreter

    x = np.ones((1, 1), F32)
    monkeypatch.setattr(interpreter, "MEMORY_LIMIT", 2**40)
    def runners(graph):  # deploy's run_numpy, the engine's Interpreter, Graph.__call__
        return [lambda: run_numpy(graph, x), lambda: Interpreter(graph).run(x),
                lambda: graph(x)]

    graph = import_onnx(_expand_then_add(10**7))  # imports: the shapes are only numbers
    for run in runners(graph):
        with pytest.raises(ml.OutOfMemoryError, match=(
                r"(?s)add: cannot allocate shape \(10000000, 10000000\) of float32: "
                r"400,000,000,000,000 bytes.*while running node #1 add.*ONNX node #1 Add "
                r"'big_add'")):
            run()
    nested = ml.trace(lambda v: graph(v), x)  # tracing through it computes nothing: allowed
    assert [n.op for n in nested.nodes] == ["broadcast_to", "add"]
    monkeypatch.setattr(interpreter, "MEMORY_LIMIT", None)  # numpy's MemoryError, wrapped
    for run in runners(import_onnx(_expand_then_add(10**9))):
        with pytest.raises(ml.OutOfMemoryError, match=(
                r"(?s)add: out of memory computing float32\[1000000000, 1000000000\]: "
                r"4,000,000,000,000,000,000 bytes.*MemoryError.*ONNX node #1 Add 'big_add'")):
            run()
    # a view (Expand is broadcast_to) allocates nothing: only the nodes that do are refused
    monkeypatch.setattr(interpreter, "MEMORY_LIMIT", 100_000)
    model = _expand_then_add(1000)
    model.graph.node[1].CopyFrom(helper.make_node("ReduceSum", ["wide"], ["y"], keepdims=0))
    model.graph.output[0].CopyFrom(_info("y", []))
    assert run_numpy(import_onnx(model), x)[0] == 1e6


def test_an_op_without_export_is_named():
    x = np.ones((2, 3), F32)
    graph = ml.grad_graph(ml.trace(lambda x: ml.ops.sum(ml.ops.relu(x)), x))
    with pytest.raises(UnknownNameError, match=r"node #\d+ .*relu_grad.*no ONNX mapping"):
        export_onnx(graph)
    with pytest.raises(ArgumentError, match="bool index"):
        export_onnx(lambda x: x[True], (x,))


def test_support_table_covers_the_registry_mappings():
    rows = {name: (writes, reads) for name, writes, reads in support_table()}
    assert rows["conv2d"] == (("Conv",), ("Conv",))
    assert "LRN" in rows["avg_pool2d"][1] and "Gemm" in rows["matmul"][1]
    assert rows["dropout"] == ((), ())


# --- graph files (mlsys_lab's own format, no pickle) -------------------------------------------
def _save_load(graph, tmp_path, name="g.mlgraph"):
    path = tmp_path / name
    save_graph(graph, path)
    return load_graph(path)


def test_saved_graphs_load_as_the_same_graph_and_run_the_same(tmp_path):
    cnn = zoo.resnet_cnn(channels=4, blocks=1, seed=2)
    cnn.eval()
    x = np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(F32)
    traced = ml.trace(cnn, x)
    back = _save_load(traced, tmp_path)
    assert_same_graph(traced, back)
    assert [n.source for n in back.nodes] == [n.source for n in traced.nodes]
    assert_close(run_graph(back, [x])[0], run_graph(traced, [x])[0], tol=0)
    compiled = ml.compile(cnn, x)
    compiled(x)
    optimised = compiled.current.graph  # fused ops, a folded batch norm
    again = _save_load(optimised, tmp_path, "opt.mlgraph")
    assert_same_graph(optimised, again)
    assert_close(run_graph(again, [x])[0], run_graph(traced, [x])[0])


def test_training_graphs_and_subgraphs_round_trip(tmp_path):
    x = np.random.default_rng(4).standard_normal((2, 1, 6, 6)).astype(F32)
    w = np.random.default_rng(5).standard_normal((3, 1, 3, 3)).astype(F32)

    def loss(x, w):
        y = ml.ops.max_pool2d(ml.ops.relu(ml.ops.conv2d(x, w, padding=1)), 2)
        y = ml.ops.cond(ml.ops.sum(y) > 0, lambda t: t * 2.0, lambda t: -t, y)
        return ml.ops.sum(y[..., None, 1:, ::-1] * 0.5)

    graph = ml.grad_graph(ml.trace(loss, x, w))
    back = _save_load(graph, tmp_path)
    assert_same_graph(graph, back)
    for got, want in zip(run_graph(back, [x, w]), run_graph(graph, [x, w])):
        assert_close(got, want, tol=0)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000))
def test_random_graphs_save_and_load(seed, tmp_path_factory):
    graph, inputs = random_graph(seed, n_nodes=12)
    back = _save_load(graph, tmp_path_factory.mktemp("g"))
    assert_same_graph(graph, back)
    for got, want in zip(run_graph(back, inputs), run_graph(graph, inputs)):
        assert_close(got, want, tol=0)


def test_attribute_types_survive(tmp_path):
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    graph = ml.trace(lambda x: ml.ops.pad(ml.ops.cast(x[..., [0, 2]], "float64"),
                                          ((0, 0), (1, 0), (0, 1)), float("-inf")), x)
    back = _save_load(graph, tmp_path)
    assert_same_graph(graph, back)
    assert back.nodes[-1].attrs["value"] == float("-inf")
    assert back.nodes[1].attrs["dtype"] == np.dtype("float64")


def test_graph_files_use_no_pickle(tmp_path, monkeypatch):
    import pickle
    import zipfile

    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "dumps", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "dump", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    graph, inputs = random_graph(7)
    path = tmp_path / "g.mlgraph"
    save_graph(graph, path)
    load_graph(path)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        assert names[0] == "graph.json" and all(n.endswith(".npy") for n in names[1:])


def test_bad_graph_files_are_refused(tmp_path):
    graph, _ = random_graph(3)
    path = tmp_path / "g.mlgraph"
    save_graph(graph, path)
    data = path.read_bytes()
    cut = tmp_path / "cut.mlgraph"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_graph(cut)
    with pytest.raises(CheckpointError, match="no file"):
        load_graph(tmp_path / "missing.mlgraph")
    import json
    import zipfile

    def rewrite(doc, name):
        out = tmp_path / name
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
            for item in src.namelist():
                dst.writestr(item, json.dumps(doc) if item == "graph.json" else src.read(item))
        return out

    with zipfile.ZipFile(path) as z:
        doc = json.loads(z.read("graph.json"))
    doc["graph"]["nodes"][0]["op"] = "no_such_op"
    with pytest.raises(UnknownNameError, match="no_such_op"):
        load_graph(rewrite(doc, "op.mlgraph"))
    doc["version"] = 99
    with pytest.raises(CheckpointError, match="version 99"):
        load_graph(rewrite(doc, "v.mlgraph"))
    del doc["graph"]
    doc["version"] = 1
    with pytest.raises(CheckpointError):
        load_graph(rewrite(doc, "nograph.mlgraph"))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1))
def test_corrupted_graph_files_raise_library_errors_only(seed, tmp_path_factory):
    import io
    import json
    import zipfile

    folder = tmp_path_factory.mktemp("g")
    graph, _ = random_graph(seed % 50)
    path = folder / "g.mlgraph"
    save_graph(graph, path)
    rng = np.random.default_rng(seed)
    if rng.random() < 0.5:  # damage the archive's bytes
        path.write_bytes(_flipped(path.read_bytes(), seed))
    else:  # damage the description: one field replaced by junk
        with zipfile.ZipFile(path) as z:
            doc = json.loads(z.read("graph.json"))
            members = {n: z.read(n) for n in z.namelist() if n != "graph.json"}
        junk = [None, 1, "x", [], {}, -5, 10**6, 2.5, True, {"$slice": 1}, {"$tuple": 3},
                {"$dtype": "zz"}, {"$array": 99}, [1, 2], {"$graph": {}}]
        node = doc["graph"]
        while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            key = keys[rng.integers(len(keys))]
            if not isinstance(node[key], (dict, list)) or rng.random() < 0.3:
                node[key] = junk[rng.integers(len(junk))]
                break
            node = node[key]
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("graph.json", json.dumps(doc))
            for name, body in members.items():
                z.writestr(name, body)
        path.write_bytes(buf.getvalue())
    try:
        load_graph(path)
    except ml.MLSysError:
        pass


def test_unstorable_attributes_are_named(tmp_path):
    a = Value("a", (2,), F32)
    out = Value("b", (2,), F32)
    graph = Graph([a], [Node("identity", [a], {"hook": print}, [out])], [out])
    with pytest.raises(ArgumentError, match="node #0 identity attribute 'hook'"):
        save_graph(graph, tmp_path / "bad.mlgraph")


# --- the mapping lives on the op record -----------------------------------------------------------
def test_a_custom_op_gets_its_mapping_through_register_onnx():
    from mlsys_lab.deploy import register_onnx
    from mlsys_lab.deploy.onnx import OnnxImport
    from mlsys_lab.deploy.onnx.importer import importers
    from mlsys_lab.engine.registry import REGISTRY, AVal

    def softsign_np(x):
        return x / (1 + np.abs(x))

    def same(x):
        return AVal(x.shape, x.dtype)

    def export(ctx, node):
        ctx.emit("Softsign", [ctx.name(node.inputs[0])], ctx.name(node.output))

    softsign = ml.custom_op("test_softsign", compute=softsign_np, infer=same, replace=True)
    try:
        x = np.linspace(-3, 3, 12, dtype=F32).reshape(3, 4)
        with pytest.raises(UnknownNameError, match="test_softsign.*no ONNX mapping"):
            export_onnx(softsign, (x,))
        register_onnx("test_softsign", export=export, writes=("Softsign",))
        model = export_onnx(softsign, (x,))
        assert_close(run_onnxruntime(model, [x])[0], softsign_np(x))
        assert softsign.op.onnx.writes == ("Softsign",)
        register_onnx("test_softsign", export=export,
                      imports=(OnnxImport("Relu", lambda ctx, node, a: []),))
        with pytest.raises(GraphError, match="Relu is imported by both relu and test_softsign"):
            importers()
    finally:
        REGISTRY.pop("test_softsign", None)  # other tests enumerate the registry
