"""The ONNX mapping of the quantisation ops: ``quantize_linear`` and ``dequantize_linear``
export as ONNX ``QuantizeLinear`` / ``DequantizeLinear`` (opset 13+ semantics: round half to
even, saturate to the zero point's type, a 1-D scale quantises per channel along ``axis``), so
that a graph from :func:`~.quantize.quantize_static` (PTQ) or :func:`~.quantize.qat_to_qdq`
(QAT) is written as a QDQ model that onnxruntime runs.

Only export is mapped: mlsys_lab's Tensor dtypes have no int8 (:mod:`~mlsys_lab.engine.dtypes`),
so an imported QDQ model could not bind its int8 initializers; ``fake_quant`` (QAT's training
op) has no ONNX form and is converted with :func:`~.quantize.fake_quant_to_qdq` first.
"""

from . import quantize  # noqa: F401 - defines the two ops on the registry
from .onnx_ops import register_onnx


def _ex_qdq(onnx_type):
    def export(ctx, node):
        x, scale, zero_point = node.inputs
        if len(scale.shape) > 1:
            ctx.fail(f"ONNX {onnx_type} takes a scalar or 1-D scale, got {list(scale.shape)}")
        axis = int(node.attrs.get("axis", 1)) if len(scale.shape) == 1 else None
        ctx.emit(onnx_type, [ctx.name(x), ctx.name(scale), ctx.name(zero_point)],
                 ctx.name(node.output), axis=axis)
    return export


register_onnx("quantize_linear", export=_ex_qdq("QuantizeLinear"), writes=("QuantizeLinear",))
register_onnx("dequantize_linear", export=_ex_qdq("DequantizeLinear"),
              writes=("DequantizeLinear",))
