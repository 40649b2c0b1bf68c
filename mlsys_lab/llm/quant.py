"""Weight-only int8 for the GPT, on chapter 10's quantisation arithmetic
(:func:`mlsys_lab.deploy.quant.choose_qparams`).

Every ``Linear`` weight (K, N) is stored as int8 with one float scale per output channel
(symmetric, narrow range [-127, 127], zero point 0): 4x fewer weight bytes, which is what bounds
a decode step of a large model (each step reads every weight once). Activations stay float: the
matmul runs on the dequantised weight, ``x @ (q · s) = (x @ q) · s``, so the scale is applied to
the output columns after a matmul with the integer-valued weight.
"""

import numpy as np

from .. import ops
from ..deploy.quant import choose_qparams
from ..engine.tensor import Tensor, no_grad
from ..nn import Linear, Module, Parameter
from .model import GPT


class Int8Linear(Module):
    """A ``Linear`` whose weight is int8 per output channel (weight-only quantisation).

    Attributes:
        qweight: int8 (in_features, out_features) buffer.
        scale: float32 (out_features,) buffer: ``weight ≈ qweight · scale``.
        bias: the float bias, if any (a Parameter, kept in float).
    """

    def __init__(self, linear):
        super().__init__()
        w = linear.weight.numpy().astype(np.float64)
        qp = choose_qparams(w.min(axis=0), w.max(axis=0), bits=8, symmetric=True, axis=1)
        self.in_features, self.out_features = w.shape
        self.register_buffer("qweight", qp.quantize(w))
        self.register_buffer("scale", qp.scale.astype(np.float32))
        self.bias = None if linear.bias is None else Parameter(linear.bias.numpy().copy(),
                                                               requires_grad=False)

    def forward(self, x):
        y = ops.matmul(x, Tensor(self.qweight.astype(np.float32))) * Tensor(self.scale)
        return y if self.bias is None else y + self.bias

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, int8 per channel"


def quantize_weights(model):
    """A copy of ``model`` (a GPT) with every ``Linear`` (attention, MLP and head) replaced by
    an :class:`Int8Linear`; embeddings and layer norms stay float."""
    q = GPT(model.config)
    q.load_state_dict(model.state_dict())
    for _, module in list(q.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Linear):
                setattr(module, name, Int8Linear(child))
    return q.eval()


def weight_bytes(model):
    """Bytes of the model's weights as stored (parameters and buffers)."""
    return int(sum(np.asarray(v).nbytes for v in model.state_dict().values()))


def compare_logits(reference, quantized, ids):
    """``{"max_abs": ..., "rel_rms": ...}`` of the logit change on token ids (batch, length)."""
    with no_grad():
        a = reference(ids).numpy().astype(np.float64)
        b = quantized(ids).numpy().astype(np.float64)
    return {"max_abs": float(np.abs(a - b).max()),
            "rel_rms": float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(a ** 2)))}
