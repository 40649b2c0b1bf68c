"""Quantisation-aware training: fake-quantised ``Linear`` / ``Conv2d`` layers with learned
activation ranges (:func:`prepare_qat`), and :func:`qat_to_qdq`, which turns the trained model
into the same QDQ graph as post-training quantisation."""

from __future__ import annotations

from ... import ops
from ...engine.trace import trace
from ...errors import ArgumentError
from ...nn import Module
from ...nn.layers import Conv2d, Linear
from .observers import MinMaxObserver
from .ops import fake_quant
from .ptq import fake_quant_to_qdq, quantize_static


# --- quantisation-aware training ------------------------------------------------------------
class FakeQuantize(Module):
    """Fake-quantises its input: in training, first records the batch's range (an exponential
    moving average of min/max, ``momentum``), then applies ``fake_quant`` with the qparams of
    the recorded range. In eval mode (and while tracing) it uses the range recorded last.

    Args:
        bits: quantisation bits.
        symmetric: signed symmetric instead of asymmetric unsigned.
        momentum: EMA weight of each new batch's range.
    """

    def __init__(self, bits=8, symmetric=False, momentum=0.1):
        super().__init__()
        self.bits, self.symmetric = bits, symmetric
        self.observer = MinMaxObserver(momentum=momentum)

    def forward(self, x):
        if self.training and not x.is_tracer:
            self.observer.update(x.numpy())
        return fake_quant(x, self.qparams())

    def qparams(self):
        """The qparams of the range recorded so far."""
        return self.observer.qparams(self.bits, self.symmetric)

    def extra_repr(self):
        return f"bits={self.bits}, symmetric={self.symmetric}"


def _weight_fake_quant(weight, node_kind, bits):
    """The weight fake-quantised per output channel, symmetric, from its current range."""
    axis = 0 if node_kind == "conv2d" else 1
    w = weight.numpy()
    qp = MinMaxObserver(axis).update(w).qparams(bits, symmetric=True)
    return fake_quant(weight, qp)


class QATLinear(Module):
    """``Linear`` with fake-quantised input and weight; shares the layer's Parameters.

    While :func:`qat_to_qdq` traces the model (``exporting`` set), the weight stays float and
    is quantised afterwards to int8 with the same qparams, so it leaves as an int8 constant.
    """

    def __init__(self, linear, weight_bits=8, act_bits=8):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.weight_bits = weight_bits
        self.act = FakeQuantize(act_bits)
        self.exporting = False

    def forward(self, x):
        w = self.weight if self.exporting else \
            _weight_fake_quant(self.weight, "matmul", self.weight_bits)
        y = ops.matmul(self.act(x), w)
        return y + self.bias if self.bias is not None else y


class QATConv2d(Module):
    """``Conv2d`` with fake-quantised input and weight; shares the layer's Parameters (see
    :class:`QATLinear` for ``exporting``)."""

    def __init__(self, conv, weight_bits=8, act_bits=8):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = getattr(conv, "dilation", 1), getattr(conv, "groups", 1)
        self.weight_bits = weight_bits
        self.act = FakeQuantize(act_bits)
        self.exporting = False

    def forward(self, x):
        w = self.weight if self.exporting else \
            _weight_fake_quant(self.weight, "conv2d", self.weight_bits)
        return ops.conv2d(self.act(x), w, self.bias, self.stride, self.padding, self.dilation,
                          self.groups)


class QATModel(Module):
    """A model prepared for QAT, and the fake-quantiser of its output (the logits)."""

    def __init__(self, model, act_bits=8):
        super().__init__()
        self.model = model
        self.output = FakeQuantize(act_bits)

    def forward(self, x):
        return self.output(self.model(x))


def prepare_qat(model, weight_bits=8, act_bits=8):
    """Make ``model`` quantisation-aware: each ``nn.Linear`` / ``nn.Conv2d`` inside it is
    replaced, in place, by :class:`QATLinear` / :class:`QATConv2d` (the same Parameters, so an
    optimiser on ``model.parameters()`` keeps training them), and the returned
    :class:`QATModel` fake-quantises the output too. Fold batch norms first (QAT here has no
    BN of its own).

    Returns:
        The :class:`QATModel` to train (then convert with :func:`qat_to_qdq`).
    """
    replaced = 0
    for parent in list(model.modules()):
        names = [name for name, _ in parent.named_children()]
        for name in names:
            child = getattr(parent, name)
            if isinstance(child, Linear):
                setattr(parent, name, QATLinear(child, weight_bits, act_bits))
                replaced += 1
            elif isinstance(child, Conv2d):
                setattr(parent, name, QATConv2d(child, weight_bits, act_bits))
                replaced += 1
        for name in names:  # re-assign in order: a Sequential runs its children in that order
            setattr(parent, name, getattr(parent, name))
    if not replaced:
        raise ArgumentError(f"prepare_qat: {type(model).__name__} holds no Linear or Conv2d "
                            f"layer inside a container to make quantisation-aware")
    return QATModel(model, act_bits)


def qat_to_qdq(qat_model, *example_inputs):
    """The QDQ inference graph of a trained :class:`QATModel`: traced in eval mode with float
    weights, each activation ``fake_quant`` (with the ranges learned in training) turned into
    a Q/DQ pair (:func:`fake_quant_to_qdq`), then each weight quantised to an int8 constant
    with the qparams training used (per channel, symmetric, from its range)."""
    layers = [m for m in qat_model.modules() if isinstance(m, (QATLinear, QATConv2d))]
    bits = {m.weight_bits for m in layers}
    if len(bits) != 1:
        raise ArgumentError(f"qat_to_qdq: the layers use different weight bits {sorted(bits)}")
    qat_model.eval()
    for m in layers:
        m.exporting = True
    try:
        graph = trace(qat_model, *example_inputs, name="qat")
    finally:
        for m in layers:
            m.exporting = False
    return quantize_static(fake_quant_to_qdq(graph), weight_bits=bits.pop(), act_bits=None)
