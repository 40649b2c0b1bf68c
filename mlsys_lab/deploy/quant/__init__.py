"""Quantisation (book ch. 10, model compression).

``q = clip(round(r / s) + z, qmin, qmax)``, back ``r ≈ s (q - z)``.

``round`` rounds half to even and comes before the zero point is added, as ONNX's
QuantizeLinear computes it; ``round(r / s + z)`` would differ on a tie (``r / s = 0.5``,
``z = 1``: ``round(0.5) + 1 = 1``, but ``round(1.5) = 2``).

* the arithmetic — :func:`qrange`, :func:`choose_qparams` (symmetric / asymmetric, per tensor /
  per channel) and :class:`QParams` (quantise, dequantise, fake-quantise a numpy array);
* three registered ops — ``quantize_linear`` and ``dequantize_linear`` (ONNX's QuantizeLinear and
  DequantizeLinear: scale and zero point are tensor inputs, ``axis`` picks the channel axis) and
  ``fake_quant`` (quantise-dequantise in float, with a straight-through gradient, for QAT);
* observers for post-training calibration — :class:`MinMaxObserver` and
  :class:`HistogramObserver` (percentile or KL-divergence clipping over a growing histogram);
* post-training quantisation of a graph — :func:`calibrate` records the activations that feed
  and leave every conv/matmul with a constant weight, :func:`quantize_static` rewrites the graph
  into ONNX's QDQ form (int8 weights per channel, uint8 activations, int32 biases, each with a
  QuantizeLinear/DequantizeLinear pair), optionally with bias correction;
* quantisation-aware training — :func:`prepare_qat` swaps ``Linear``/``Conv2d`` layers for
  fake-quantised ones, :func:`qat_to_qdq` turns the trained model into the same QDQ graph.

The modules: :mod:`.params` (the arithmetic), :mod:`.ops` (the three ops), :mod:`.observers`,
:mod:`.ptq` (calibration, QDQ rewriting), :mod:`.qat`; :mod:`.int8_kernels` lowers a QDQ graph
onto int8 kernels (:func:`lower_qdq`: ``qlinear_matmul``, ``qlinear_conv``; the 32-bit
``vpmaddwd`` row dot is :mod:`.int8_simd`), and :mod:`.int16_pairs` models an x86 int8 kernel
without VNNI (what onnxruntime computes there). This package re-exports the public names.
"""

from .int8_kernels import lower_qdq
from .observers import HistogramObserver, MinMaxObserver, kl_threshold, observer
from .ops import (
    DEQUANTIZE_LINEAR,
    FAKE_QUANT,
    QUANTIZE_LINEAR,
    dequantize_linear,
    fake_quant,
    fake_quant_qparams,
    quantize_linear,
)
from .params import (
    QUANT_DTYPES,
    QParams,
    along,
    choose_qparams,
    dequantize,
    qrange,
    quantize,
    storage_dtype,
)
from .ptq import (
    Calibration,
    LinearSite,
    bias_qparams,
    bias_shift,
    calibrate,
    fake_quant_to_qdq,
    linear_sites,
    model_bytes,
    post_training_quantize,
    qdq_tensors,
    quantize_static,
    weight_qparams,
)
from .qat import FakeQuantize, QATConv2d, QATLinear, QATModel, prepare_qat, qat_to_qdq

__all__ = ["QParams", "qrange", "storage_dtype", "choose_qparams", "quantize", "dequantize",
           "QUANT_DTYPES", "QUANTIZE_LINEAR", "DEQUANTIZE_LINEAR", "FAKE_QUANT",
           "quantize_linear", "dequantize_linear", "fake_quant", "fake_quant_qparams",
           "MinMaxObserver", "HistogramObserver", "kl_threshold", "observer", "along",
           "LinearSite", "linear_sites", "Calibration", "calibrate", "weight_qparams",
           "bias_shift", "bias_qparams", "quantize_static", "post_training_quantize",
           "qdq_tensors", "model_bytes", "fake_quant_to_qdq", "FakeQuantize", "QATLinear",
           "QATConv2d", "QATModel", "prepare_qat", "qat_to_qdq", "lower_qdq"]
