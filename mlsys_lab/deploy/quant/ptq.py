"""Post-training quantisation of a graph: :func:`calibrate` records the activations that feed
and leave every conv/matmul with a constant weight, :func:`quantize_static` rewrites the graph
into ONNX's QDQ form (int8 weights per channel, uint8 activations, int32 biases), optionally
with bias correction; :func:`fake_quant_to_qdq` turns a QAT graph's fake_quant nodes into Q/DQ
pairs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...engine.interpreter import Interpreter
from ...engine.passes.rewrite import Rewriter, graph_pass
from ...engine.registry import get
from ...errors import ArgumentError
from ..passes import (
    channel_vector,
    constant_weight,
    output_channel_axis,
    sole_user,
    weight_channel_axis,
)
from .observers import MinMaxObserver, observer
from .ops import fake_quant_qparams
from .params import QParams, qrange


# --- post-training quantisation of a graph --------------------------------------------------
@dataclass
class LinearSite:
    """A conv2d or matmul with a constant weight, and what the quantiser folds around it.

    Attributes:
        main: the ``conv2d`` / ``matmul`` node.
        root: the activation it reads, before any view ops (``reshape``, ``transpose``).
        views: those view nodes, from ``root`` to ``main``'s input.
        bias_add: the ``add`` of a per-channel constant right after it, or None.
        bias: that constant as one float64 value per output channel, or None.
        relu: a ``relu`` right after (the bias), or None.
    """

    main: object
    root: object
    views: tuple
    bias_add: object
    bias: np.ndarray | None
    relu: object

    @property
    def out(self):
        """The block's result, where its output is quantised."""
        return (self.relu or self.bias_add or self.main).output


def _view_root(value):
    views = []
    while value.producer is not None and get(value.producer.op).view is not None:
        views.insert(0, value.producer)
        value = value.producer.inputs[0]
    return value, tuple(views)


def linear_sites(graph):
    """Every :class:`LinearSite` of ``graph``, in node order."""
    outs = set(map(id, graph.outputs))
    sites = []
    for n in graph.nodes:
        if constant_weight(graph, n) is None:
            continue
        root, views = _view_root(n.inputs[0])
        v, add, bias = n.output, sole_user(n.output, outs), None
        if add is not None and add.op == "add" and add.output.aval == v.aval \
                and add.inputs[0] is not add.inputs[1]:
            other = add.inputs[1] if add.inputs[0] is v else add.inputs[0]
            arr = graph.consts.get(other)
            bias = None if arr is None else channel_vector(arr, v.shape, output_channel_axis(n))
        if bias is None:
            add = None
        else:
            v = add.output
        relu = sole_user(v, outs)
        relu = relu if relu is not None and relu.op == "relu" else None
        sites.append(LinearSite(n, root, views, add, bias, relu))
    return sites


@dataclass
class Calibration:
    """What :func:`calibrate` recorded.

    Attributes:
        observers: value name -> observer of each activation to quantise (every site's input
            root and result).
        input_means: main node's output name -> the mean of its input per channel (for bias
            correction).
        batches: how many batches were seen.
    """

    observers: dict
    input_means: dict
    batches: int = 0


def _channel_mean(x, node):
    axis = 1 if node.op == "conv2d" else x.ndim - 1
    return np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(x.shape[axis], -1).mean(1)


def calibrate(graph, batches, method="minmax", **options):
    """Run ``graph`` on calibration ``batches`` and record the range of every activation the
    quantiser will quantise.

    Args:
        graph: a float inference graph (after :func:`~mlsys_lab.deploy.passes.fold_batch_norm`).
        batches: an iterable of inputs (an array, or a tuple of arrays for several inputs).
        method: ``"minmax"``, ``"percentile"`` or ``"kl"`` (see :func:`observer`).
        options: passed to each observer (``bins``, ``percentile``).

    Returns:
        A :class:`Calibration`.
    """
    sites = linear_sites(graph)
    if not sites:
        raise ArgumentError(f"calibrate: {graph.name} has no conv2d/matmul with a constant weight "
                            f"to quantise")
    watched = {}
    for s in sites:
        watched.setdefault(s.root.name, s.root)
        watched.setdefault(s.out.name, s.out)
    cal = Calibration({name: observer(method, **options) for name in watched}, {})
    sums = {}
    run = Interpreter(graph, free=False)
    for batch in batches:
        run.run(*(batch if isinstance(batch, tuple) else (batch,)))
        for name, v in watched.items():
            cal.observers[name].update(run.env[id(v)])
        for s in sites:
            m = _channel_mean(run.env[id(s.main.inputs[0])], s.main)
            total, k = sums.get(s.main.output.name, (0.0, 0))
            sums[s.main.output.name] = (total + m, k + 1)
        cal.batches += 1
    if not cal.batches:
        raise ArgumentError("calibrate: no calibration batches")
    cal.input_means = {k: total / n for k, (total, n) in sums.items()}
    return cal


def weight_qparams(w, node, bits=8, per_channel=True):
    """Symmetric (narrow-range, signed) qparams of a conv/matmul weight ``w``: one scale per
    output channel (axis 0 of OIHW, axis 1 of a (K, N) matmul weight) or one in all."""
    axis = weight_channel_axis(node) if per_channel else None
    return MinMaxObserver(axis).update(w).qparams(bits, symmetric=True)


def bias_shift(w, w_hat, mean, node):
    """How much quantising ``w`` to ``w_hat`` moves the layer's mean output, per channel:
    ``E[x] · (w_hat - w)`` for an input whose per-channel mean is ``mean``. For a convolution,
    the response to a constant image of those means (borders aside)."""
    dw = w_hat.astype(np.float64) - w.astype(np.float64)
    if node.op == "matmul":
        return mean @ dw
    attrs = node.attrs
    dil = attrs.get("dilation", (1, 1))
    size = [d * (k - 1) + 1 for d, k in zip(dil, dw.shape[2:])]
    image = np.broadcast_to(mean[None, :, None, None], (1, len(mean), *size))
    extra = {k: attrs[k] for k in ("dilation", "groups") if k in attrs}
    shift = get("conv2d").compute(np.ascontiguousarray(image), dw, stride=(1, 1),
                                  padding=(0, 0), **extra)
    return np.asarray(shift).reshape(-1)


def quantize_static(graph, calibration=None, weight_bits=8, act_bits=8, per_channel=True,
                    act_symmetric=False, bias_correction=False):
    """Rewrite a float graph into ONNX's QDQ form: each conv/matmul with a constant weight reads
    ``dequantize_linear(int8 weight)``, its activations pass through a ``quantize_linear`` /
    ``dequantize_linear`` pair, and its bias becomes an int32 tensor of scale ``s_x * s_w``.

    The QDQ graph computes in float what the int8 model computes (up to float rounding), so it
    measures the accuracy of quantisation; :func:`~.int8_kernels.lower_qdq` turns it into the
    int8 kernels, and an ONNX exporter writes its Q/DQ nodes as they are.

    Args:
        graph: the float inference graph that was calibrated.
        calibration: a :class:`Calibration` of ``graph`` (needed unless ``act_bits`` is None and
            no bias correction is asked for).
        weight_bits: bits of the symmetric weights.
        act_bits: bits of the activations; None quantises only the weights.
        per_channel: one weight scale per output channel (else one per tensor).
        act_symmetric: signed symmetric activations (int8) instead of asymmetric uint8.
        bias_correction: subtract from each bias the shift ``E[x]·(Ŵ - W)`` that weight
            rounding puts on the mean output (Nagel et al.'s empirical bias correction with the
            calibration means).

    Returns:
        The QDQ :class:`~mlsys_lab.engine.graph.Graph` (the input graph is unchanged).
    """
    if calibration is None and (act_bits is not None or bias_correction):
        raise ArgumentError("quantize_static: activations and bias correction need a "
                            "calibration (see calibrate)")
    sites = linear_sites(graph)
    by_main = {id(s.main): s for s in sites}
    by_add = {id(s.bias_add): s for s in sites if s.bias_add is not None}
    act = {} if act_bits is None else {
        name: ob.qparams(act_bits, act_symmetric) for name, ob in calibration.observers.items()}
    rw = Rewriter(graph)
    done = set()

    def qdq(old):
        if old.name not in act or id(old) in done:
            return
        done.add(id(old))
        rw.bind(old, _emit_qdq(rw, rw[old], act[old.name]))

    for v in graph.inputs:
        qdq(v)
    weights = {}
    for n in graph.nodes:
        site = by_main.get(id(n)) or by_add.get(id(n))
        if site is not None and site.main is n:
            weights[id(n)] = _emit_weight_site(rw, graph, site, weight_bits, per_channel,
                                               act, calibration, bias_correction)
        elif site is not None:
            _emit_bias(rw, site, weights[id(site.main)], act)
        else:
            rw.copy(n)
        for o in n.outputs:
            qdq(o)
    return rw.build()


def _emit_qdq(rw, value, qp):
    """``dequantize_linear(quantize_linear(value))`` with ``qp``; returns the DQ value."""
    p = qp.onnx(value.dtype)
    s, z = rw.const(p["scale"]), rw.const(p["zero_point"])
    axis = {"axis": qp.axis if qp.axis is not None else 1}
    q = rw.emit("quantize_linear", [value, s, z], axis, name=f"{value.name}_q")
    return rw.emit("dequantize_linear", [q, s, z], axis, name=f"{value.name}_dq")


def _dq_const(rw, q_array, qp, dtype, name):
    p = qp.onnx(dtype)
    axis = {"axis": qp.axis if qp.axis is not None else 1}
    return rw.emit("dequantize_linear", [rw.const(q_array, name=f"{name}_q"),
                                         rw.const(p["scale"]), rw.const(p["zero_point"])],
                   axis, name=f"{name}_dq")


def _emit_weight_site(rw, graph, site, bits, per_channel, act, calibration, correct):
    """Emit the weight's DQ and the conv/matmul; returns ``(weight qparams, bias vector)``."""
    n = site.main
    w = graph.consts[n.inputs[1]]
    wq = weight_qparams(w, n, bits, per_channel)
    w_int = wq.quantize(w)
    wd = _dq_const(rw, w_int, wq, w.dtype, n.inputs[1].name)
    rw.maybe_dead(rw[n.inputs[1]])
    y = rw.emit(n.op, [rw[n.inputs[0]], wd], n.attrs, name=n.output.name, source=n.source)
    bias = site.bias
    if correct:
        shift = bias_shift(w, wq.dequantize(w_int), calibration.input_means[n.output.name], n)
        bias = (0.0 if bias is None else bias) - shift
    rw.bind(n.output, y)
    if site.bias_add is None and bias is not None:  # bias correction made a bias
        rw.bind(n.output, _emit_bias_value(rw, site, y, bias, wq, act))
    return wq, bias


def _emit_bias(rw, site, weight_info, act):
    wq, bias = weight_info
    add = site.bias_add
    other = add.inputs[1] if add.inputs[0] is site.main.output else add.inputs[0]
    rw.maybe_dead(rw[other])
    rw.bind(add.output, _emit_bias_value(rw, site, rw[site.main.output], bias, wq, act,
                                         name=add.output.name))


def _bias_shape(node, c):
    return (1, c, 1, 1) if node.op == "conv2d" else (c,)


def _emit_bias_value(rw, site, y, bias, wq, act, name=None):
    """``y + bias``, the bias an int32 tensor of scale ``s_x * s_w`` behind a DQ when the input
    is quantised, else a float constant."""
    n = site.main
    shape = _bias_shape(n, len(bias))
    xq = act.get(site.root.name)
    if xq is None:
        b = rw.const(np.asarray(bias).reshape(shape).astype(y.dtype))
    else:
        bq = bias_qparams(xq, wq, len(bias), axis=1 if n.op == "conv2d" else 0)
        b = _dq_const(rw, bq.quantize(np.asarray(bias).reshape(shape)), bq, y.dtype,
                      f"{n.output.name}_bias")
    return rw.emit("add", [y, b], name=name, source=n.source)


def bias_qparams(x_qparams, w_qparams, channels, axis=0):
    """The int32 qparams of a bias added to a conv/matmul of those input and weight qparams:
    scale ``s_x * s_w`` per channel, zero point 0 — the accumulator's own units."""
    scale = np.broadcast_to(float(x_qparams.scale) * w_qparams.scale, (channels,)).copy()
    qmin, qmax = qrange(32, signed=True)
    return QParams(scale, np.zeros(channels, np.int64), qmin, qmax, axis)


def post_training_quantize(graph, batches, method="minmax", bias_correction=False, **options):
    """:func:`calibrate` on ``batches`` with ``method``, then :func:`quantize_static`
    (``options``: its keyword arguments). Returns the QDQ graph."""
    cal = calibrate(graph, batches, method)
    return quantize_static(graph, cal, bias_correction=bias_correction, **options)


def qdq_tensors(graph):
    """Every quantised tensor of a QDQ (or lowered int8) graph, for an exporter or a table:
    a list of ``{"node", "op", "tensor", "scale", "zero_point", "dtype", "axis"}`` dicts, one
    per ``quantize_linear`` / ``dequantize_linear`` node (``tensor`` is the name of its data
    input; scale and zero point are the constant arrays)."""
    rows = []
    for n in graph.nodes:
        if n.op not in ("quantize_linear", "dequantize_linear"):
            continue
        s, z = graph.consts.get(n.inputs[1]), graph.consts.get(n.inputs[2])
        rows.append({"node": n.output.name, "op": n.op, "tensor": n.inputs[0].name,
                     "scale": s, "zero_point": z, "dtype": np.dtype(n.inputs[2].dtype).name,
                     "axis": n.attrs.get("axis") if s is not None and s.ndim else None})
    return rows


def model_bytes(graph):
    """Bytes of the graph's constants (its weights, quantised or not)."""
    return int(sum(a.nbytes for a in graph.consts.values()))


@graph_pass
def fake_quant_to_qdq(graph):
    """Replace each ``fake_quant`` node by what it means in ONNX: ``dequantize_linear`` of the
    quantised constant (a weight), or a ``quantize_linear`` / ``dequantize_linear`` pair (an
    activation, whose clip range must then be the whole storage type, as ONNX's Q saturates
    there)."""
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op != "fake_quant":
            rw.copy(n)
            continue
        qp = fake_quant_qparams(n.attrs)
        x = n.inputs[0]
        if x in graph.consts:
            rw.maybe_dead(rw[x])
            rw.bind(n.output, _dq_const(rw, qp.quantize(graph.consts[x]), qp, x.dtype,
                                        n.output.name))
            continue
        info = np.iinfo(qp.dtype)
        if (qp.qmin, qp.qmax) != (info.min, info.max):
            raise ArgumentError(f"fake_quant_to_qdq: node {n.output.name} clips to "
                                f"[{qp.qmin}, {qp.qmax}], which a {qp.dtype.name} "
                                f"QuantizeLinear cannot express (use 8-bit activations)")
        rw.bind(n.output, _emit_qdq(rw, rw[x], qp))
    return rw.build()
