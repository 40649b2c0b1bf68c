"""Register the Numba kernels as operator implementations, so operator selection can pick them.

Imported from the package root (``import mlsys_lab``): kernels register themselves, the engine
never imports them. Within an op, the kernels registered first are preferred, and each one's
``accepts`` says where it applies; the op's numpy reference stays the last resort on ``cpu``.

* ``cpu-numba`` / ``cuda``: the matrix-multiply ladders of chapter 8 (:mod:`.cpu`, :mod:`.cuda`).
* ``cpu``: convolution as BLAS GEMMs — Winograd F(2×2, 3×3) (:mod:`.winograd`) where it beats
  img2col, img2col otherwise (:mod:`.conv_gemm`), for ``conv2d``, ``fused_conv`` and both
  gradients — and pooling with its gradients as Numba loops (:mod:`.pooling`).
* ``cpu``: the embedding-bag gather with software prefetch (:mod:`.embedding`; its optimiser row
  updates are called by :mod:`mlsys_lab.optim` directly).
* ``cpu`` / ``cuda``: scaled dot-product attention as the tiled online-softmax (FlashAttention-2)
  forward (:mod:`.attention`, :mod:`.attention_cuda`); the CPU kernel declares its O(L)
  workspace so the memory planner counts it.

Eager mode runs the kernels flagged ``eager`` (see :class:`~mlsys_lab.engine.registry.Kernel`):
img2col convolution and its gradients (they differ from the reference only in the order of the
GEMMs' sums), max pooling with its VJP and JVP, and the embedding-bag gather (bit-identical).
Winograd changes the arithmetic and average pooling rounds differently, so they serve compiled
graphs only; so does the tiled attention kernel (its online softmax rescales partial sums, a
different rounding from the reference's one softmax).
"""

from ..engine.passes.fusion import ops as _fused_ops  # noqa: F401  (registers fused_conv)
from ..engine.registry import register_impl
from . import attention, conv_gemm, embedding, pooling, winograd  # noqa: F401  (embedding registers itself)


def _cpu_matmul(a, b):
    from . import cpu

    return cpu.matmul(a, b, variant="packed")


def _cuda_matmul(a, b):
    from numba.core import config

    from . import cuda

    config_ = cuda.SIMULATOR_CONFIGS["double_buffer"] if config.ENABLE_CUDASIM else None
    return cuda.matmul(a, b, variant="double_buffer", config=config_)


def _two_matrices(avals, out, attrs):
    """The ladders multiply two matrices of one floating dtype."""
    a, b = avals
    if len(a.shape) != 2 or len(b.shape) != 2:
        return f"rank {len(a.shape)} @ rank {len(b.shape)}, not two matrices"
    if a.dtype != b.dtype or a.dtype.kind != "f":
        return f"dtypes {a.dtype} and {b.dtype}, not one floating dtype"
    return None


register_impl("matmul", "cpu-numba", _cpu_matmul, name="numba.matmul_packed", returns=True,
              dtypes=("float32", "float64"), max_ndim=2, accepts=_two_matrices)
register_impl("matmul", "cuda", _cuda_matmul, name="cuda.matmul_double_buffer", returns=True,
              dtypes=("float32",), max_ndim=2, accepts=_two_matrices)


def _both(first, second):
    """An ``accepts`` rule: ``first``'s reason, else ``second``'s."""
    def accepts(avals, out, attrs):
        return first(avals, out, attrs) or second(avals, out, attrs)
    accepts.__doc__ = f"{first.__doc__} and {second.__doc__}"
    return accepts


_WINOGRAD = "numba.winograd_input+numpy.matmul+numba.winograd_output"
_IMG2COL = "numba.img2col+numpy.matmul+numba.to_nchw"
_FLOATS = conv_gemm.float_operands

register_impl("conv2d", "cpu", winograd.conv2d_winograd_out, name=_WINOGRAD,
              accepts=_both(_FLOATS, winograd.winograd_accepts))
register_impl("conv2d", "cpu", conv_gemm.conv2d_gemm_out, name=_IMG2COL, accepts=_FLOATS,
              eager=True)
register_impl("fused_conv", "cpu", winograd.fused_conv_winograd_out, name=_WINOGRAD,
              accepts=_both(conv_gemm.per_channel_bias, winograd.winograd_accepts))
register_impl("fused_conv", "cpu", conv_gemm.fused_conv_gemm_out, name=_IMG2COL,
              accepts=conv_gemm.per_channel_bias)
register_impl("conv2d_grad_weight", "cpu", conv_gemm.conv2d_grad_weight_gemm_out,
              name="numba.img2col+numba.to_rows+numpy.matmul", accepts=_FLOATS, eager=True)
register_impl("conv2d_grad_input", "cpu", winograd.conv2d_grad_input_winograd_out,
              name=_WINOGRAD, accepts=_both(_FLOATS, winograd.winograd_grad_input_accepts))
register_impl("conv2d_grad_input", "cpu", conv_gemm.conv2d_grad_input_gemm_out,
              name="numba.to_rows+numpy.matmul+numba.col2img", accepts=_FLOATS, eager=True)

# Max pooling and its JVP pick values, so they are exact; its VJP sums a pixel's shares from
# overlapping windows in window order where the reference sums them in tap order. Average
# pooling accumulates in float64 and scales by 1/size: not eager.
for _op, _kernel, _exact, _eager in (
        ("max_pool2d", pooling.max_pool2d_out, True, True),
        ("max_pool2d_scatter", pooling.max_pool2d_scatter_out, False, True),
        ("max_pool2d_select", pooling.max_pool2d_select_out, True, True),
        ("avg_pool2d", pooling.avg_pool2d_out, False, False),
        ("avg_pool2d_grad", pooling.avg_pool2d_grad_out, False, False)):
    register_impl(_op, "cpu", _kernel, name=f"numba.{_op.replace('2d', '')}",
                  accepts=_FLOATS, exact=_exact, eager=_eager)

def _cuda_attention(q, k, v, *mask, is_causal=False, scale=None, enable_gqa=False):
    from . import attention_cuda

    return attention_cuda.attention_forward(q, k, v, mask[0] if mask else None,
                                            is_causal=is_causal, scale=scale,
                                            enable_gqa=enable_gqa)[0]


register_impl("scaled_dot_product_attention", "cuda", _cuda_attention,
              name="cuda.flash_attention", returns=True, dtypes=("float32", "float64"))
register_impl("scaled_dot_product_attention", "cpu", attention.attention_out,
              name="numba.flash_attention", dtypes=("float32", "float64"),
              workspace=attention.forward_workspace)
register_impl("scaled_dot_product_attention_grad", "cpu", attention.attention_grad_out,
              name="numba.flash_attention_backward", dtypes=("float32", "float64"),
              workspace=attention.backward_workspace)
