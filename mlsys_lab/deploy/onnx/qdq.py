"""The ONNX mapping of the quantisation ops: ``quantize_linear`` and ``dequantize_linear``
export as ONNX ``QuantizeLinear`` / ``DequantizeLinear`` (opset 13+ semantics: round half to
even, saturate to the zero point's type, a 1-D scale quantises per channel along ``axis``), so
that a graph from :func:`~mlsys_lab.deploy.quant.quantize_static` (PTQ) or
:func:`~mlsys_lab.deploy.quant.qat_to_qdq` (QAT) is written as a QDQ model that onnxruntime runs.

Both import back: an ONNX QuantizeLinear / DequantizeLinear becomes the registry op, with the
zero point ONNX lets a model leave out made a constant 0 (uint8 for QuantizeLinear, the
input's dtype for DequantizeLinear). ``fake_quant`` (QAT's training op) has no ONNX form and
is converted with :func:`~mlsys_lab.deploy.quant.fake_quant_to_qdq` first.
"""

import numpy as np

from ..quant import ops as quant_ops  # noqa: F401 - defines the two ops on the registry
from .mapping import OnnxImport, register_onnx


def _ex_qdq(onnx_type):
    def export(ctx, node):
        x, scale, zero_point = node.inputs
        block = int(node.attrs.get("block_size", 0))
        if len(scale.shape) > 1 and not block:
            ctx.fail(f"ONNX {onnx_type} takes a scalar or 1-D scale, got {list(scale.shape)}")
        axis = int(node.attrs.get("axis", 1)) if len(scale.shape) >= 1 else None
        extra = {"block_size": block} if block else {}
        if node.attrs.get("saturate", True) is False:
            extra["saturate"] = 0
        ctx.emit(onnx_type, [ctx.name(x), ctx.name(scale), ctx.name(zero_point)],
                 ctx.name(node.output), axis=axis, **extra)
    return export


def _im_qdq(op_name):
    def convert(ctx, node, a):
        x, scale, zero_point = (ctx.input(node, i) for i in range(3))
        if zero_point is None:
            if op_name == "dequantize_linear":
                dtype = x.dtype
            elif a.get("output_dtype"):
                dtype = ctx.numpy_dtype(a["output_dtype"],
                                        f"import_onnx: {node.label()}: 'output_dtype'")
            else:
                dtype = np.uint8
            zero_point = ctx.constant(np.zeros(scale.shape, dtype))
        if tuple(scale.shape) != tuple(zero_point.shape) and int(np.prod(scale.shape)) == 1 \
                and int(np.prod(zero_point.shape)) == 1:  # ONNX: one element is per tensor
            scale, zero_point = (v if v.shape == () else ctx.prepare("reshape", v, shape=())
                                 for v in (scale, zero_point))
        extra = {}
        if a.get("block_size"):
            extra["block_size"] = int(a["block_size"])
        if op_name == "quantize_linear" and not int(a.get("saturate", 1)):
            extra["saturate"] = False
        if op_name == "dequantize_linear" and a.get("output_dtype"):
            ctx.fail(node, "attribute 'output_dtype' is not supported (the output takes the "
                           "scale's dtype)")
        return [ctx.emit(op_name, x, scale, zero_point, axis=int(a.get("axis", 1)), **extra)]
    return convert


_Q_ATTRS = ("axis", "block_size", "saturate", "output_dtype")
register_onnx("quantize_linear", export=_ex_qdq("QuantizeLinear"), writes=("QuantizeLinear",),
              imports=(OnnxImport("QuantizeLinear", _im_qdq("quantize_linear"), _Q_ATTRS),))
register_onnx("dequantize_linear", export=_ex_qdq("DequantizeLinear"),
              writes=("DequantizeLinear",),
              imports=(OnnxImport("DequantizeLinear", _im_qdq("dequantize_linear"),
                                  ("axis", "block_size", "output_dtype")),))
