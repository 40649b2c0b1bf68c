"""Malformed input at every public entry point gives a library error that names the op.

Each row feeds one entry point (tensor creation, every ``ml.ops`` function, tracing, compiling
and calling a Compiled, the autodiff API, checkpoints, layers, optimisers, the memory planner)
something PyTorch would refuse: wrong shapes, dtypes, ranks, axes, sizes, strides, paddings or
file contents. The call must raise an ``mlsys_lab.errors.MLSysError`` (never a bare numpy or
Python exception) whose message names the entry point or op, within a time limit.
"""

import json
import signal
import zipfile

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn, ops
from mlsys_lab.engine import memory
from mlsys_lab.engine.memory import Lifetime
from mlsys_lab.errors import MLSysError
from mlsys_lab.nn import checkpoint

T = ml.tensor
F = np.ones((2, 3), np.float32)
IMG = np.ones((1, 1, 5, 5), np.float32)
W33 = np.ones((1, 1, 3, 3), np.float32)
LIMIT_S = 60  # a case that runs longer is a hang


def X(*shape, dtype="float32"):
    return T(np.ones(shape, dtype))


def row(id_, fn, *names):
    """One case: ``fn(tmp)`` must raise an MLSysError naming each of ``names`` (a name may be a
    tuple of alternatives; matching ignores case)."""
    return pytest.param(fn, names, id=id_)


# --- tensor creation and Tensor methods --------------------------------------------------------
CREATION = [
    row("tensor-ragged", lambda t: T([[1, 2], [3]]), "tensor"),
    row("tensor-int-overflow", lambda t: T(2**63), "tensor"),
    row("tensor-object", lambda t: T(object()), "tensor"),
    row("tensor-string", lambda t: T("abc"), "tensor"),
    row("tensor-none", lambda t: T(None), "tensor"),
    row("tensor-dict", lambda t: T({"a": 1.0}), "tensor"),
    row("tensor-complex", lambda t: T(np.ones(2, np.complex64)), "complex64"),
    row("tensor-unknown-dtype", lambda t: T([1.0], dtype="float128x"), "tensor"),
    row("tensor-int-requires-grad", lambda t: T([1, 2], requires_grad=True), "tensor"),
    row("tensor-list-of-tensors-ragged", lambda t: T([X(2), X(3)]), "tensor"),
    row("zeros-negative", lambda t: ml.zeros((-1, 3)), "zeros"),
    row("zeros-huge", lambda t: ml.zeros((10**12,)), "zeros"),
    row("zeros-huge-2d", lambda t: ml.zeros((10**7, 10**7)), "zeros"),
    row("zeros-float-size", lambda t: ml.zeros((2.5,)), "zeros"),
    row("zeros-string-size", lambda t: ml.zeros(("a",)), "zeros"),
    row("zeros-bad-dtype", lambda t: ml.zeros(3, dtype="complex64"), ("zeros", "complex64")),
    row("ones-negative", lambda t: ml.ones((2, -2)), "ones"),
    row("ones-huge", lambda t: ml.ones((10**12,)), "ones"),
    row("randn-negative", lambda t: ml.randn(-2, 3), "randn"),
    row("randn-huge", lambda t: ml.randn(10**6, 10**7), "randn"),
    row("randn-float-size", lambda t: ml.randn(1.5), "randn"),
    row("bool-of-vector", lambda t: bool(X(2)), "bool"),
    row("float-of-vector", lambda t: float(X(2)), "float"),
    row("int-of-vector", lambda t: int(X(2)), "int"),
    row("item-of-vector", lambda t: X(2).item(), "item"),
    row("len-of-scalar", lambda t: len(T(1.0)), "len"),
    row("iter-of-scalar", lambda t: list(T(1.0)), ("iter", "0-d")),
    row("index-out-of-range", lambda t: X(3)[5], "getitem"),
    row("index-float", lambda t: X(3)[1.5], "getitem"),
    row("index-string", lambda t: X(3)["a"], "getitem"),
    row("index-too-many", lambda t: X(3)[0, 0], "getitem"),
    row("index-step-zero", lambda t: X(3)[::0], "getitem"),
    row("index-list-out-of-range", lambda t: X(3)[[0, 7]], ("getitem", "take")),
    row("requires-grad-on-int", lambda t: T([1, 2]).requires_grad_(), "requires_grad"),
    row("reshape-method-bad", lambda t: X(6).reshape(4, 2), "reshape"),
]

# --- every ml.ops function ------------------------------------------------------------------
UNARY = ["abs", "cos", "exp", "log", "neg", "relu", "sigmoid", "sign", "sin", "sqrt", "tanh"]
FLOAT_ONLY = ["cos", "exp", "log", "sigmoid", "sin", "sqrt", "tanh"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
          "ge"]
OPS = (
    [row(f"{op}-none", lambda t, op=op: getattr(ops, op)(None), op) for op in UNARY]
    + [row(f"{op}-string", lambda t, op=op: getattr(ops, op)("x"), op) for op in UNARY]
    + [row(f"{op}-ragged-list", lambda t, op=op: getattr(ops, op)([[1.0], [2.0, 3.0]]), op)
       for op in UNARY]
    + [row(f"{op}-shapes", lambda t, op=op: getattr(ops, op)(X(2, 3), X(4)), op, "(2, 3)",
           "(4,)") for op in BINARY]
    + [row(f"{op}-none", lambda t, op=op: getattr(ops, op)(X(2), None), op) for op in BINARY]
    + [row(f"{op}-uint8-plus-300", lambda t, op=op: getattr(ops, op)(X(2, dtype="uint8"), 300),
           op) for op in ("add", "sub", "mul", "maximum")]
    + [row(f"{op}-int64-2**63", lambda t, op=op: getattr(ops, op)(X(2, dtype="int64"), 2**63),
           op) for op in ("add", "mul", "eq")]
    + [
        row("where-float-condition", lambda t: ops.where(X(2), X(2), X(2)), "where"),
        row("where-shapes", lambda t: ops.where(T([True, False]), X(3), X(2)), "where"),
        row("cast-complex", lambda t: ops.cast(X(2), "complex64"), "cast"),
        row("cast-unknown", lambda t: ops.cast(X(2), "nope"), "cast"),
        row("cast-object", lambda t: ops.cast(X(2), object), "cast"),
        row("matmul-scalar", lambda t: ops.matmul(T(1.0), X(2)), "matmul"),
        row("matmul-inner", lambda t: ops.matmul(X(2, 3), X(2, 3)), "matmul", "(2, 3)"),
        row("matmul-dtypes", lambda t: ops.matmul(X(2, 2), X(2, 2, dtype="float64")), "matmul"),
        row("matmul-bool", lambda t: ops.matmul(X(2, 2, dtype="bool"), X(2, 2, dtype="bool")),
            "matmul"),
        row("matmul-batch", lambda t: ops.matmul(X(2, 2, 3), X(3, 3, 1)), "matmul"),
    ]
    + [row(f"{op}-axis-float", lambda t, op=op: getattr(ops, op)(X(2, 3), axis=1.5), op, "1.5")
       for op in ("sum", "mean", "max", "argmax", "softmax", "log_softmax")]
    + [row(f"{op}-axis-out-of-range", lambda t, op=op: getattr(ops, op)(X(2, 3), axis=2), op)
       for op in ("sum", "mean", "max", "argmax", "softmax", "log_softmax")]
    + [row(f"{op}-axis-string", lambda t, op=op: getattr(ops, op)(X(2, 3), axis="0"), op)
       for op in ("sum", "mean", "max", "argmax", "softmax", "log_softmax")]
    + [row(f"{op}-axis-repeated", lambda t, op=op: getattr(ops, op)(X(2, 3), axis=(0, -2)), op,
           "repeated") for op in ("sum", "mean", "max")]
    + [
        row("mean-int", lambda t: ops.mean(T([1, 2])), "mean", "int64"),
        row("max-empty-axis", lambda t: ops.max(ml.zeros((0, 3)), axis=0), "max"),
        row("max-empty-all", lambda t: ops.max(ml.zeros((0,))), "max"),
        row("argmax-empty", lambda t: ops.argmax(ml.zeros((0,))), "argmax"),
        row("reshape-negative-dims", lambda t: ops.reshape(X(6), (-2, -3)), "reshape", "-2"),
        row("reshape-size", lambda t: ops.reshape(X(6), (4, 2)), "reshape", "(6,)"),
        row("reshape-two-minus-one", lambda t: ops.reshape(X(6), (-1, -1)), "reshape"),
        row("reshape-float", lambda t: ops.reshape(X(6), (2.5, 2)), "reshape"),
        row("reshape-string", lambda t: ops.reshape(X(6), "ab"), "reshape"),
        row("reshape-huge", lambda t: ops.reshape(X(6), (10**12, 6)), "reshape"),
        row("transpose-not-permutation", lambda t: ops.transpose(X(2, 3), (0, 0)), "transpose"),
        row("transpose-length", lambda t: ops.transpose(X(2, 3), (1, 0, 2)), "transpose"),
        row("transpose-out-of-range", lambda t: ops.transpose(X(2, 3), (0, 5)), "transpose"),
        row("transpose-float", lambda t: ops.transpose(X(2, 3), (0.5, 1)), "transpose"),
        row("broadcast_to-incompatible", lambda t: ops.broadcast_to(X(3), (2, 4)),
            "broadcast_to"),
        row("broadcast_to-fewer-dims", lambda t: ops.broadcast_to(X(2, 3), (3,)),
            "broadcast_to"),
        row("concatenate-empty", lambda t: ops.concatenate([]), "concatenate"),
        row("concatenate-shapes", lambda t: ops.concatenate([X(2, 3), X(3, 2)]), "concatenate"),
        row("concatenate-axis", lambda t: ops.concatenate([X(2), X(2)], axis=1), "concatenate"),
        row("concatenate-axis-float", lambda t: ops.concatenate([X(2), X(2)], axis=0.5),
            "concatenate"),
        row("concatenate-scalars", lambda t: ops.concatenate([T(1.0), T(2.0)]), "concatenate"),
        row("stack-empty", lambda t: ops.stack([]), "stack"),
        row("stack-shapes", lambda t: ops.stack([X(2), X(3)]), "stack"),
        row("stack-axis", lambda t: ops.stack([X(2), X(2)], axis=3), "stack"),
        row("getitem-out-of-range", lambda t: ops.getitem(X(3), 3), "getitem"),
        row("getitem-float", lambda t: ops.getitem(X(3), 0.5), "getitem"),
        row("getitem-list-out-of-range", lambda t: ops.getitem(X(3), [0, 5]), "getitem"),
        row("take-float-indices", lambda t: ops.take(X(3), T([0.5])), "take"),
        row("take-out-of-range", lambda t: ops.take(X(3), T([3])), "take"),
        row("take-axis", lambda t: ops.take(X(3), T([0]), axis=2), "take"),
        row("embedding-out-of-range", lambda t: ops.embedding(X(4, 2), T([4])),
            ("take", "embedding")),
        row("pad-pairs", lambda t: ops.pad(X(2, 2), ((1, 1),)), "pad"),
        row("pad-float", lambda t: ops.pad(X(2, 2), 1.5), "pad"),
        row("pad-string", lambda t: ops.pad(X(2, 2), "a"), "pad"),
        row("scaled_dot_product_attention-shapes",
            lambda t: ops.scaled_dot_product_attention(X(2, 3, 4), X(2, 5, 3), X(2, 5, 4)),
            "scaled_dot_product_attention", "(2, 3, 4)", "(2, 5, 3)"),
        row("scaled_dot_product_attention-int",
            lambda t: ops.scaled_dot_product_attention(T([[1, 2]]), T([[1, 2]]), T([[1, 2]])),
            "scaled_dot_product_attention"),
        row("scaled_dot_product_attention-mask-and-causal",
            lambda t: ops.scaled_dot_product_attention(X(3, 4), X(3, 4), X(3, 4),
                                                       attn_mask=X(3, 3), is_causal=True),
            "scaled_dot_product_attention"),
        row("softmax-int", lambda t: ops.softmax(T([1, 2])), "softmax"),
        row("log_softmax-int", lambda t: ops.log_softmax(T([1, 2])), "log_softmax"),
        row("one_hot-float", lambda t: ops.one_hot(X(2), 3), "one_hot"),
        row("one_hot-negative", lambda t: ops.one_hot(T([-1]), 3), "one_hot"),
        row("one_hot-too-large", lambda t: ops.one_hot(T([3]), 3), "one_hot"),
        row("one_hot-classes-float", lambda t: ops.one_hot(T([0]), 2.5), "one_hot"),
        row("cross_entropy-float-targets", lambda t: ops.cross_entropy(X(3, 4), X(3)),
            "cross_entropy"),
        row("cross_entropy-out-of-range", lambda t: ops.cross_entropy(X(3, 4), T([0, 1, 4])),
            "cross_entropy"),
        row("cross_entropy-negative-target", lambda t: ops.cross_entropy(X(3, 4), T([0, -1, 2])),
            "cross_entropy"),
        row("cross_entropy-shapes", lambda t: ops.cross_entropy(X(3, 4), T([0, 1])),
            "cross_entropy"),
        row("mse_loss-shapes", lambda t: ops.mse_loss(X(3), X(4)), "mse_loss"),
        row("mse_loss-int", lambda t: ops.mse_loss(T([1]), T([2])), "mse_loss"),
        row("conv2d-stride-zero", lambda t: ops.conv2d(T(IMG), T(W33), stride=0), "conv2d",
            "stride"),
        row("conv2d-stride-negative", lambda t: ops.conv2d(T(IMG), T(W33), stride=-1), "conv2d"),
        row("conv2d-stride-float", lambda t: ops.conv2d(T(IMG), T(W33), stride=1.5), "conv2d"),
        row("conv2d-padding-negative", lambda t: ops.conv2d(T(IMG), T(W33), padding=-1),
            "conv2d", "padding"),
        row("conv2d-padding-triple", lambda t: ops.conv2d(T(IMG), T(W33), padding=(1, 1, 1)),
            "conv2d"),
        row("conv2d-channels", lambda t: ops.conv2d(X(1, 2, 5, 5), T(W33)), "conv2d"),
        row("conv2d-kernel-too-big", lambda t: ops.conv2d(X(1, 1, 2, 2), T(W33)), "conv2d"),
        row("conv2d-dtypes", lambda t: ops.conv2d(X(1, 1, 5, 5, dtype="float64"), T(W33)),
            "conv2d"),
        row("conv2d-bias-shape", lambda t: ops.conv2d(T(IMG), T(W33), X(2)), "conv2d", "bias"),
        row("conv2d-kernel-empty", lambda t: ops.conv2d(T(IMG), X(1, 1, 0, 0)), "conv2d",
            "kernel"),
    ]
    + [row(f"{op}-{what}", lambda t, op=op, kw=kw: getattr(ops, op)(T(IMG), **kw), op, word)
       for op in ("max_pool2d", "avg_pool2d")
       for what, kw, word in (
           ("kernel-zero", dict(kernel_size=0), "kernel"),
           ("kernel-negative", dict(kernel_size=-2), "kernel"),
           ("kernel-float", dict(kernel_size=1.5), "kernel"),
           ("stride-zero", dict(kernel_size=2, stride=0), "stride"),
           ("padding-negative", dict(kernel_size=2, padding=-1), "padding"),
           ("padding-over-half", dict(kernel_size=2, stride=2, padding=3), "padding"),
           ("window-too-big", dict(kernel_size=7), op))]
    + [
        row("dropout-p-negative", lambda t: ops.dropout(X(3), -0.1), "dropout"),
        row("dropout-p-string", lambda t: ops.dropout(X(3), "a"), "dropout"),
        row("dropout-int", lambda t: ops.dropout(T([1, 2]), 0.5), "dropout"),
        row("layer_norm-weight-shape", lambda t: ops.layer_norm(X(2, 3), X(4)),
            ("layer_norm", "mul")),
        row("layer_norm-int", lambda t: ops.layer_norm(T([[1, 2]])), ("layer_norm", "mean")),
        row("batch_norm-stats-shape", lambda t: ops.batch_norm(X(2, 3, 2, 2), X(4), X(4)),
            ("batch_norm", "sub", "reshape")),
        row("identity-none", lambda t: ops.identity(None), "identity"),
        row("cond-vector-predicate", lambda t: ops.cond(T([True, False]), ops.neg, ops.exp,
                                                        X(2)), "cond"),
        row("cond-branch-types", lambda t: ml.trace(
            lambda p, v: ops.cond(p, lambda a: a, lambda a: ops.sum(a), v),
            np.array(True), np.ones(2)), "cond"),
        row("manual_seed-string", lambda t: ops.manual_seed("abc"), "manual_seed"),
        row("manual_seed-float", lambda t: ops.manual_seed(1.5), "manual_seed"),
        row("set_rng_state-not-a-state", lambda t: ops.set_rng_state({"state": 1}),
            "set_rng_state"),
        row("set_rng_state-string", lambda t: ops.set_rng_state("pcg64"), "set_rng_state"),
    ]
)


# --- tracing, compiling, calling a Compiled -------------------------------------------------
def _branchy(v):
    if v.sum() > 0:
        return v
    return -v


def _compiled(f, *args, **kw):
    return ml.compile(f, *args, **kw)


def _compiled_bad_target(profile):
    def run(t):
        c = ml.compile(ops.cross_entropy, F, np.array([0, 1]))
        return c(F, np.array([0, 7]), profile=profile)
    return run


COMPILE = [
    row("trace-python-if", lambda t: ml.trace(_branchy, np.ones(3)), "cond"),
    row("trace-bad-argument", lambda t: ml.trace(lambda a: a, "abc"), "trace"),
    row("trace-returns-string", lambda t: ml.trace(lambda a: "x", np.ones(2)), "trace"),
    row("trace-shape-error-names-line", lambda t: ml.trace(lambda a: a + np.ones(4), np.ones(3)),
        "add", "test_malformed_input.py"),
    row("compile-shape-error", lambda t: ml.compile(lambda a: a @ a, np.ones((2, 3))),
        "matmul"),
    row("compile-conv-padding", lambda t: ml.compile(
        lambda a, w: ops.conv2d(a, w, padding=-1), IMG, W33), "conv2d"),
    row("compile-huge-broadcast", lambda t: ml.compile(
        lambda v: ops.broadcast_to(v, (10**6, 10**6)) * 2.0, np.ones(1, np.float32)),
        ("broadcast_to", "compile", "arena", "mul")),
    row("compile-donate-out-of-range", lambda t: ml.compile(lambda v: v * 2.0, F,
                                                            donate=[(3, 0)]), "donate"),
    row("compile-donate-bad-output", lambda t: ml.compile(lambda v: v * 2.0, F,
                                                          donate=[(0, 5)]), "donate"),
    row("compile-donate-not-pairs", lambda t: ml.compile(lambda v: v * 2.0, F, donate=[0]),
        "donate"),
    row("compile-unknown-device", lambda t: ml.compile(lambda v: v * 2.0, F, device="tpu"),
        "tpu"),
    row("compile-unknown-strategy", lambda t: ml.compile(lambda v: v * 2.0, F,
                                                         strategy="nope"), "nope"),
    row("compile-unknown-pass", lambda t: ml.compile(lambda v: v * 2.0, F, passes=["nope"]),
        "nope"),
    row("compile-static-argnums-range", lambda t: ml.compile(lambda v: v * 2.0, F,
                                                             static_argnums=3), "static_argnums"),
    row("compiled-wrong-shape", lambda t: _compiled(lambda v: v * 2.0, F)(np.ones((3, 2),
                                                                                  np.float32)),
        "3,2"),
    row("compiled-wrong-dtype", lambda t: _compiled(lambda v: v * 2.0, F)(np.ones((2, 3))),
        "f64"),
    row("compiled-wrong-count", lambda t: _compiled(lambda v: v * 2.0, F)(F, F), "expects 1"),
    row("compiled-ragged-input", lambda t: _compiled(lambda v: v * 2.0, F)([[1.0], [2.0, 3.0]]),
        ("input", "tensor")),
    row("compiled-bad-target", _compiled_bad_target(True), "cross_entropy", "node"),
    row("compiled-bad-target-generated", _compiled_bad_target(False), "cross_entropy", "node"),
    row("compiled-take-out-of-range", lambda t: _compiled(
        lambda v, i: ops.take(v, i), np.ones(3), np.array([0]))(np.ones(3), np.array([9])),
        "take", "node"),
    row("compiled-one-hot-out-of-range", lambda t: _compiled(
        lambda i: ops.one_hot(i, 3), np.array([0]))(np.array([5]), profile=False),
        "one_hot", "node"),
]


# --- autodiff ----------------------------------------------------------------------------------
def _backward_twice(t):
    x = T([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    y.backward()


AUTODIFF = [
    row("grad-int-input", lambda t: ml.grad(lambda v: ops.sum(v))(np.array([1, 2])), "grad"),
    row("grad-non-scalar", lambda t: ml.grad(lambda v: v * 2.0)(np.ones(3)), "grad", "(3,)"),
    row("grad-argnums-range", lambda t: ml.grad(lambda v: ops.sum(v), argnums=2)(np.ones(3)),
        "argnums"),
    row("grad-argnums-float", lambda t: ml.grad(lambda v: ops.sum(v), argnums=0.5)(np.ones(3)),
        "argnums"),
    row("grad-returns-string", lambda t: ml.grad(lambda v: "x")(np.ones(3)), "grad"),
    row("grad-returns-none", lambda t: ml.grad(lambda v: None)(np.ones(3)), "grad"),
    row("value_and_grad-non-scalar", lambda t: ml.value_and_grad(lambda v: v)(np.ones(2)),
        "grad"),
    row("vjp-cotangent-shape", lambda t: ml.vjp(lambda v: v * 2.0, np.ones(3))[1](np.ones(4)),
        ("vjp", "backward", "gradient"), "(4,)"),
    row("jvp-count", lambda t: ml.jvp(lambda v: v, [np.ones(2)], [np.ones(2), np.ones(2)]),
        "jvp"),
    row("jvp-tangent-shape", lambda t: ml.jvp(lambda v: v, [np.ones(2)], [np.ones(3)]), "jvp"),
    row("hvp-non-scalar", lambda t: ml.hvp(lambda v: v * v, [np.ones(2)], [np.ones(2)]),
        "grad"),
    row("backward-non-scalar", lambda t: (T([1.0, 2.0], requires_grad=True) * 2.0).backward(),
        "backward"),
    row("backward-no-grad", lambda t: (T([1.0]) * 2.0).sum().backward(), "backward"),
    row("backward-twice", _backward_twice, "backward"),
    row("backward-grad-shape", lambda t: (T([1.0, 2.0], requires_grad=True) * 2.0).backward(
        np.ones(3)), "backward"),
    row("grad_graph-non-scalar", lambda t: ml.grad_graph(ml.trace(lambda v: v * 2.0,
                                                                  np.ones(3))), "grad_graph"),
    row("grad_graph-wrt-range", lambda t: ml.grad_graph(ml.trace(lambda v: ops.sum(v),
                                                                 np.ones(3)), wrt=[4]),
        "grad_graph"),
]


# --- checkpoints --------------------------------------------------------------------------------
def _header(kinds, fmt=None):
    return json.dumps({"format": fmt or checkpoint.FORMAT, "kinds": kinds})


def _write(path, header, **arrays):
    """A .npz written by hand, with ``header`` (str, or None for no header) and ``arrays``."""
    extra = {} if header is None else {checkpoint._HEADER: np.asarray(header)}
    np.savez(path, **extra, **arrays)
    return path


def _hostile(make):
    def run(t):
        return ml.load(make(t / "bad.npz"))
    return run


def _load_bytes(t, data):
    path = t / "raw.npz"
    path.write_bytes(data)
    return ml.load(path)


def _empty_zip():
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w"):
        pass
    return buf.getvalue()


def _truncated(t):
    good = t / "good.npz"
    ml.save({"w": np.arange(1000.0), "step": 3}, good)
    data = good.read_bytes()
    bad = t / "truncated.npz"
    bad.write_bytes(data[: len(data) // 2])
    return ml.load(bad)


def _member_not_npy(t):
    path = t / "odd.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(checkpoint._HEADER + ".npy", b"not an npy file at all")
    return ml.load(path)


def _model_load(state):
    def run(t):
        model = nn.Linear(3, 2, rng=0)
        return model.load_state_dict(state)
    return run


SAVE_LOAD = [
    row("save-not-dict", lambda t: ml.save([1, 2], t / "a.npz"), "save"),
    row("save-object-array", lambda t: ml.save({"a": np.array([object()])}, t / "a.npz"),
        "save"),
    row("save-key-slash", lambda t: ml.save({"a/b": np.ones(2)}, t / "a.npz"), "save"),
    row("save-key-not-string", lambda t: ml.save({1: np.ones(2)}, t / "a.npz"), "save"),
    row("save-unsupported-value", lambda t: ml.save({"a": {1, 2}}, t / "a.npz"), "save"),
    row("save-into-missing-folder", lambda t: ml.save({"a": 1}, t / "nope" / "a.npz"), "save"),
    row("load-missing-file", lambda t: ml.load(t / "missing.npz"), "load"),
    row("load-not-a-zip", lambda t: _load_bytes(t, b"\x00garbage" * 64), "load"),
    row("load-empty-file", lambda t: _load_bytes(t, b""), "load"),
    row("load-zip-without-arrays", lambda t: _load_bytes(t, _empty_zip()), "load"),
    row("load-truncated", _truncated, "load"),
    row("load-member-not-npy", _member_not_npy, "load"),
    row("load-no-header", _hostile(lambda p: _write(p, None, a=np.ones(2))), "load"),
    row("load-header-not-json", _hostile(lambda p: _write(p, "{not json", a=np.ones(2))),
        "load"),
    row("load-header-is-list", _hostile(lambda p: _write(p, "[1, 2]", a=np.ones(2))), "load"),
    row("load-wrong-format", _hostile(lambda p: _write(p, _header({"a": "array"}, "other/9"),
                                                       a=np.ones(2))), "load"),
    row("load-missing-kinds", _hostile(lambda p: _write(
        p, json.dumps({"format": checkpoint.FORMAT}), a=np.ones(2))), "load"),
    row("load-kinds-not-dict", _hostile(lambda p: _write(
        p, json.dumps({"format": checkpoint.FORMAT, "kinds": [1]}), a=np.ones(2))), "load"),
    row("load-conflicting-keys", _hostile(lambda p: _write(
        p, _header({"a": "array", "a/b": "array"}), **{"a": np.ones(2), "a/b": np.ones(2)})),
        "load"),
    row("load-conflicting-keys-reversed", _hostile(lambda p: _write(
        p, _header({"a/b": "array", "a": "array"}), **{"a/b": np.ones(2), "a": np.ones(2)})),
        "load"),
    row("load-unknown-kind", _hostile(lambda p: _write(p, _header({"a": "pickle"}),
                                                       a=np.ones(2))), "load"),
    row("load-kind-not-string", _hostile(lambda p: _write(p, _header({"a": 5}), a=np.ones(2))),
        "load"),
    row("load-int-kind-on-array", _hostile(lambda p: _write(p, _header({"a": "int"}),
                                                            a=np.ones((2, 2)))), "load"),
    row("load-bool-kind-on-array", _hostile(lambda p: _write(p, _header({"a": "bool"}),
                                                             a=np.ones(3))), "load"),
    row("load-float-kind-on-string", _hostile(lambda p: _write(p, _header({"a": "float"}),
                                                               a=np.asarray("abc"))), "load"),
    row("load-header-contents-disagree", _hostile(lambda p: _write(
        p, _header({"a": "array", "b": "array"}), a=np.ones(2))), "load"),
    row("load-object-array", _hostile(lambda p: _write(
        p, _header({"a": "array"}), a=np.array([{"x": 1}], dtype=object))), "load"),
    row("load_state_dict-missing", _model_load({"weight": np.ones((3, 2), np.float32)}),
        "load_state_dict"),
    row("load_state_dict-shape", _model_load({"weight": np.ones((2, 3), np.float32),
                                              "bias": np.ones(2, np.float32)}),
        "load_state_dict", "weight"),
    row("load_state_dict-not-array", _model_load({"weight": "abc", "bias": np.ones(2)}),
        "load_state_dict"),
]


# --- layers and optimisers -----------------------------------------------------------------------
def _params():
    return nn.Linear(3, 2, rng=0).parameters()


LAYERS = [
    row("Linear-features", lambda t: nn.Linear(3, 2)(X(4, 5)), "Linear"),
    row("Linear-scalar-input", lambda t: nn.Linear(3, 2)(T(1.0)), "Linear"),
    row("Linear-int-input", lambda t: nn.Linear(3, 2)(X(4, 3, dtype="int64")),
        ("Linear", "matmul")),
    row("Linear-negative-size", lambda t: nn.Linear(-1, 2), "Linear"),
    row("Linear-float-size", lambda t: nn.Linear(2.5, 2), "Linear"),
    row("Conv2d-channels", lambda t: nn.Conv2d(3, 4, 3)(X(1, 2, 5, 5)), "conv2d"),
    row("Conv2d-kernel-too-big", lambda t: nn.Conv2d(1, 1, 3)(X(1, 1, 2, 2)), "conv2d"),
    row("Conv2d-rank2-input", lambda t: nn.Conv2d(1, 1, 3)(X(5, 5)), "conv2d"),
    row("Conv2d-stride-zero", lambda t: nn.Conv2d(1, 1, 3, stride=0)(T(IMG)),
        ("Conv2d", "conv2d")),
    row("Conv2d-kernel-zero", lambda t: nn.Conv2d(1, 1, 0)(T(IMG)), ("Conv2d", "conv2d")),
    row("Conv2d-negative-channels", lambda t: nn.Conv2d(-1, 1, 3), "Conv2d"),
    row("MaxPool2d-kernel-zero", lambda t: nn.MaxPool2d(0)(T(IMG)), "max_pool2d"),
    row("MaxPool2d-padding-over-half", lambda t: nn.MaxPool2d(2, padding=2)(T(IMG)),
        "max_pool2d"),
    row("AvgPool2d-stride-zero", lambda t: nn.AvgPool2d(2, stride=0)(T(IMG)), "avg_pool2d"),
    row("BatchNorm2d-channels", lambda t: nn.BatchNorm2d(3)(X(2, 4, 2, 2)),
        ("BatchNorm2d", "batch_norm", "sub")),
    row("BatchNorm2d-rank2", lambda t: nn.BatchNorm2d(3)(X(2, 3)), ("BatchNorm2d", "mean")),
    row("LayerNorm-features", lambda t: nn.LayerNorm(4)(X(2, 3)), ("LayerNorm", "mul")),
    row("Embedding-out-of-range", lambda t: nn.Embedding(5, 2)(T([7])), ("Embedding", "take")),
    row("Embedding-float-ids", lambda t: nn.Embedding(5, 2)(X(2)), ("Embedding", "take")),
    row("Dropout-p", lambda t: nn.Dropout(1.5)(X(3)), ("Dropout", "dropout")),
    row("Flatten-scalar", lambda t: nn.Flatten()(T(1.0)), ("Flatten", "reshape")),
    row("Sequential-mismatch", lambda t: nn.Sequential(nn.Linear(3, 4), nn.Linear(5, 2))(X(1, 3)),
        "Linear"),
    row("SGD-lr-negative", lambda t: ml.optim.SGD(_params(), lr=-0.1), "SGD", "lr"),
    row("SGD-lr-nan", lambda t: ml.optim.SGD(_params(), lr=float("nan")), "SGD", "lr"),
    row("SGD-lr-string", lambda t: ml.optim.SGD(_params(), lr="fast"), "SGD", "lr"),
    row("SGD-momentum-negative", lambda t: ml.optim.SGD(_params(), lr=0.1, momentum=-0.5),
        "SGD", "momentum"),
    row("SGD-weight-decay-negative", lambda t: ml.optim.SGD(_params(), lr=0.1,
                                                            weight_decay=-1.0), "SGD"),
    row("SGD-no-params", lambda t: ml.optim.SGD([], lr=0.1), "SGD"),
    row("SGD-not-parameters", lambda t: ml.optim.SGD([np.ones(3)], lr=0.1), "SGD"),
    row("Adam-lr-negative", lambda t: ml.optim.Adam(_params(), lr=-1e-3), "Adam", "lr"),
    row("Adam-beta-above-one", lambda t: ml.optim.Adam(_params(), betas=(1.5, 0.9)), "Adam",
        "beta"),
    row("Adam-eps-negative", lambda t: ml.optim.Adam(_params(), eps=-1.0), "Adam", "eps"),
    row("RMSProp-lr-negative", lambda t: ml.optim.RMSProp(_params(), lr=-0.01), "RMSProp",
        "lr"),
    row("RMSProp-alpha-negative", lambda t: ml.optim.RMSProp(_params(), alpha=-0.5), "RMSProp",
        "alpha"),
    row("optimizer-load-garbage", lambda t: ml.optim.SGD(_params(), lr=0.1).load_state_dict(
        {"hyper": 3}), "load_state_dict"),
]


# --- record files (data/records.py) -----------------------------------------------------------
def _record_file(t, data=None, name="a.rec"):
    from mlsys_lab.data.records import RecordFile, RecordWriter
    path = t / name
    if data is None:
        with RecordWriter(path) as writer:
            writer.write(b"one")
            writer.write({"x": np.arange(3)})
        return RecordFile(path)
    path.write_bytes(data(path) if callable(data) else data)
    return RecordFile(path)


def _record_bytes(t):
    from mlsys_lab.data.records import RecordWriter
    with RecordWriter(t / "good.rec") as writer:
        writer.write(b"payload")
    return (t / "good.rec").read_bytes()


def _plain_file(t):
    (t / "plain").write_bytes(b"")
    return t / "plain"


def _records():
    from mlsys_lab.data import records as rec
    return rec


RECORDS = [
    row("RecordFile-directory", lambda t: _records().RecordFile(t), ("RecordFile", "directory")),
    row("RecordFile-missing", lambda t: _records().RecordFile(t / "no.rec"), "no.rec"),
    row("RecordFile-empty", lambda t: _record_file(t, b""), ("a.rec", "truncated")),
    row("RecordFile-truncated", lambda t: _record_file(t, _record_bytes(t)[:-5]), "a.rec"),
    row("RecordFile-wrong-magic", lambda t: _record_file(t, b"NOTAREC!" + _record_bytes(t)[8:]),
        ("a.rec", "magic")),
    row("RecordFile-file-as-directory",
        lambda t: _records().RecordFile(_plain_file(t) / "a.rec"), ("plain", "not a directory")),
    row("RecordFile-device", lambda t: _records().RecordFile("/dev/null"), "regular file"),
    row("RecordFile-none", lambda t: _records().RecordFile(None), "RecordFile"),
    row("RecordWriter-directory", lambda t: _records().RecordWriter(t), ("RecordWriter",
                                                                         "directory")),
    row("RecordWriter-missing-folder", lambda t: _records().RecordWriter(t / "no" / "a.rec"),
        ("RecordWriter", "does not exist")),
    row("RecordWriter-file-as-directory",
        lambda t: _records().RecordWriter(_plain_file(t) / "a.rec"), ("plain", "not a directory")),
    row("write_sharded-file-as-directory",
        lambda t: _records().write_sharded([b"a"], _plain_file(t) / "p", 2), "plain"),
    row("read_shard-directory", lambda t: list(_records().read_shard(t)), "directory"),
    row("decode_payload-truncated", lambda t: _records().decode_payload(b"\x01\x02"),
        "decode_payload"),
]


# --- the memory planner -----------------------------------------------------------------------
def L(i, size, start, end):
    return Lifetime(i, size, start, end)


def _verify_missing(t):
    recs = [L("a", 64, 0, 1), L("b", 64, 1, 2)]
    p = memory.plan(recs[:1], "naive")
    return memory.verify(p, recs)


def _verify_overlap(t):
    recs = [L("a", 64, 0, 1), L("b", 64, 1, 2)]
    p = memory.plan(recs, "naive")
    p.offsets["b"] = 0
    return memory.verify(p, recs)


MEMORY = [
    row("Lifetime-negative-size", lambda t: L("a", -1, 0, 1), ("Lifetime", "size")),
    row("Lifetime-float-size", lambda t: L("a", 1.5, 0, 1), ("Lifetime", "size")),
    row("Lifetime-end-before-start", lambda t: L("a", 8, 3, 1), ("Lifetime", "start")),
    row("Lifetime-string-start", lambda t: L("a", 8, "0", 1), ("Lifetime", "start")),
    row("Lifetime-huge-size", lambda t: L("a", 10**30, 0, 1), ("Lifetime", "size")),
    row("lower_bound-alignment-zero", lambda t: memory.lower_bound([L("a", 8, 0, 1)], 0),
        ("lower_bound", "alignment")),
    row("lower_bound-not-lifetimes", lambda t: memory.lower_bound([(1, 2, 3)]),
        ("lower_bound", "Lifetime")),
    row("plan-duplicate-ids", lambda t: memory.plan([L("a", 8, 0, 1), L("a", 8, 2, 3)]),
        ("plan", "id")),
    row("plan-unknown-strategy", lambda t: memory.plan([L("a", 8, 0, 1)], "nope"), "nope"),
    row("plan-alignment-negative", lambda t: memory.plan([L("a", 8, 0, 1)], alignment=-64),
        "alignment"),
    row("plan-not-lifetimes", lambda t: memory.plan([("a", 8, 0, 1)]), ("plan", "Lifetime")),
    row("plan-inplace-missing", lambda t: memory.plan([L("a", 8, 0, 1)], inplace=[("b", "a")]),
        "in-place"),
    row("plan-inplace-bad-lifetimes", lambda t: memory.plan(
        [L("a", 8, 0, 3), L("b", 8, 1, 2)], inplace=[("b", "a")]), "in-place"),
    row("verify-missing-offset", _verify_missing, ("verify", "offset")),
    row("verify-overlap", _verify_overlap, "overlap"),
]

ALL = CREATION + OPS + COMPILE + AUTODIFF + SAVE_LOAD + LAYERS + RECORDS + MEMORY


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("fn, names", ALL)
def test_malformed_input_raises_a_library_error(fn, names, tmp_path):
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    try:
        with np.errstate(all="ignore"):
            fn(tmp_path)
    except _Hang:
        pytest.fail(f"no answer within {LIMIT_S} s (a hang)")
    except Exception as e:  # noqa: BLE001 - the point is to see which exception it is
        assert isinstance(e, MLSysError), \
            f"raised a bare {type(e).__module__}.{type(e).__name__}: {e}"
        msg = str(e).lower()
        for name in names:
            alternatives = name if isinstance(name, tuple) else (name,)
            assert any(a.lower() in msg for a in alternatives), \
                f"{type(e).__name__} does not name {' or '.join(alternatives)}: {e}"
    else:
        pytest.fail("no error raised")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_every_ops_function_has_a_malformed_case():
    covered = {p.id.split("-")[0] for p in OPS + ACCEPT_OR_REFUSE}
    missing = sorted(set(ops.__all__) - covered - {"rng_seed"})
    assert not missing, f"ml.ops functions without a malformed-input case: {missing}"


def _readonly_donation():
    c = ml.compile(lambda v: v * 2.0, np.ones(3, np.float32), donate=[(0, 0)])
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    out = c(ro)
    np.testing.assert_array_equal(ro, 1.0)  # a read-only array is never written
    return out


def _no_inputs():
    return ml.compile(lambda: ops.exp(T(np.float32(1.0))) * 2.0)()


def accept(id_, fn, want, name):
    """A call PyTorch (or JAX) accepts: ``fn()`` must return ``want`` or raise a library
    error naming ``name`` (never a bare exception). ``want`` None: any result is fine."""
    return pytest.param(fn, want, name, id=id_)


ARANGE = T(np.arange(9.0).reshape(3, 3))
ACCEPT_OR_REFUSE = (
    [accept(f"{op}-int", lambda op=op: getattr(ops, op)(T([1, 2])),
            getattr(np, op)(np.array([1.0, 2.0])) if op != "sigmoid" else
            1 / (1 + np.exp(-np.array([1.0, 2.0]))), op) for op in FLOAT_ONLY]
    + [
        accept("compile-without-inputs", _no_inputs, 2 * np.e, "compile"),
        accept("compile-donated-read-only", _readonly_donation, [2.0, 2.0, 2.0], "donate"),
        accept("manual_seed-negative", lambda: ops.manual_seed(-1), None, "manual_seed"),
        accept("get_rng_state-round-trip", lambda: ops.set_rng_state(ops.get_rng_state()), None,
               "get_rng_state"),
        accept("jvp-int-primal", lambda: ml.jvp(lambda v: v * 2.0, [np.array([1, 2])],
                                                [np.array([1.0, 1.0])])[0], [2.0, 4.0], "jvp"),
        accept("index-two-arrays", lambda: ARANGE[[0, 1], [1, 2]], [1.0, 5.0], "getitem"),
        accept("broadcast_to-minus-one-keeps", lambda: ops.broadcast_to(X(1), (2, -1)),
               np.ones((2, 1)), "broadcast_to"),
        accept("concatenate-dtypes", lambda: ops.concatenate([X(2), X(2, dtype="float64")]),
               np.ones(4), "concatenate"),
        accept("pad-negative-crops", lambda: ops.pad(X(2, 2), ((-1, 0), (0, 0))),
               np.ones((1, 2)), "pad"),
        accept("one_hot-infer-classes", lambda: ops.one_hot(T([0, 2]), -1),
               np.eye(3)[[0, 2]], "one_hot"),
        accept("cross_entropy-unbatched", lambda: ops.cross_entropy(X(4), T(1)), np.log(4),
               "cross_entropy"),
        accept("mse_loss-mixed-dtypes", lambda: ops.mse_loss(X(3), X(3, dtype="float64")), 0.0,
               "mse_loss"),
        accept("conv2d-unbatched", lambda: ops.conv2d(X(1, 5, 5), T(W33)), np.full((1, 3, 3), 9),
               "conv2d"),
        accept("conv2d-int", lambda: ops.conv2d(X(1, 1, 5, 5, dtype="int64"),
                                                X(1, 1, 3, 3, dtype="int64")),
               np.full((1, 1, 3, 3), 9), "conv2d"),
        accept("max_pool2d-unbatched", lambda: ops.max_pool2d(X(1, 4, 4), 2), np.ones((1, 2, 2)),
               "max_pool2d"),
        accept("avg_pool2d-unbatched", lambda: ops.avg_pool2d(X(1, 4, 4), 2), np.ones((1, 2, 2)),
               "avg_pool2d"),
        accept("max_pool2d-int", lambda: ops.max_pool2d(X(1, 1, 4, 4, dtype="int64"), 2),
               np.ones((1, 1, 2, 2)), "max_pool2d"),
        accept("dropout-p-one", lambda: ops.dropout(X(3), 1.0), np.zeros(3), "dropout"),
        accept("cond-float-predicate", lambda: ops.cond(T(1.0), ops.neg, ops.exp, X(2)),
               -np.ones(2), "cond"),
    ]
)


@pytest.mark.parametrize("fn, want, name", ACCEPT_OR_REFUSE)
def test_accepted_or_refused_by_a_library_error(fn, want, name):
    try:
        with np.errstate(all="ignore"):
            got = fn()
    except MLSysError as e:
        assert name in str(e), f"the error does not name {name}: {e}"
        return
    if want is not None:
        np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=1e-6)


NUMPY_ON_TENSORS = {
    "exp": (lambda v: np.exp(v), lambda x: np.exp(x)),
    "tanh": (lambda v: np.tanh(v), lambda x: 1 - np.tanh(x) ** 2),
    "sum": (lambda v: np.sum(v * v), lambda x: 2 * x),
    "mean": (lambda v: np.mean(v * v), lambda x: 2 * x / x.size),
    "maximum": (lambda v: np.maximum(v, 0.0), lambda x: (x > 0) * 1.0),
    "sqrt": (lambda v: np.sqrt(v), lambda x: 0.5 / np.sqrt(x)),
    "multiply": (lambda v: np.multiply(v, v), lambda x: 2 * x),
    "concatenate": (lambda v: np.concatenate([v, v]), lambda x: 2 * np.ones_like(x)),
    "dot": (lambda v: np.dot(v, v), lambda x: 2 * x),
    "where": (lambda v: np.where(v > 1.0, v, 0.0), lambda x: (x > 1) * 1.0),
    "clip": (lambda v: np.clip(v, 0.0, 1.5), lambda x: ((x > 0) & (x < 1.5)) * 1.0),
}


@pytest.mark.parametrize("how", ["grad", "compiled_grad"])
@pytest.mark.parametrize("name", list(NUMPY_ON_TENSORS))
def test_numpy_functions_never_drop_the_gradient(name, how):
    """A numpy function applied to a Tensor being differentiated either computes through
    ``ml.ops`` (the right gradient) or raises a library error naming it: never a silent zero."""
    fn, dfn = NUMPY_ON_TENSORS[name]
    x = np.array([0.5, 1.25, 2.0])

    def loss(v):
        return ops.sum(fn(v))

    g = ml.grad(loss)
    try:
        got = g(x) if how == "grad" else ml.compile(g, x)(x)
    except MLSysError as e:
        assert name in str(e), f"the error does not name np.{name}: {e}"
        return
    np.testing.assert_allclose(np.asarray(got), dfn(x), rtol=1e-12,
                               err_msg=f"np.{name} on a Tensor gave a wrong gradient")


def test_lower_bound_never_overflows_silently():
    recs = [L("a", 2**62, 0, 1), L("b", 2**62, 0, 1), L("c", 2**62, 1, 2)]
    try:
        got = memory.lower_bound(recs)
    except MLSysError as e:
        assert "lower_bound" in str(e) or "size" in str(e), e
        return
    assert got == 2**63, f"lower_bound of two live 2**62-byte tensors is {got}"
