"""mlsys_lab.deploy: from a trained model to an inference model (book chapter 10).

Inference passes (:mod:`.passes`: dropout removal, BN folding, affine collapse), int8
quantisation (:mod:`.quantize`: observers, PTQ, QAT; :mod:`.int8_kernels`: Numba int8 kernels),
pruning (:mod:`.prune`), distillation (:mod:`.distill`) and a weight-obfuscation demo
(:mod:`.obfuscate`).

Interchange: :func:`export_onnx` / :func:`import_onnx` (each op's ONNX mapping lives on its
registry record, ``Op.onnx``, set in :mod:`.onnx_ops`; a QDQ graph from :mod:`.quantize`
exports as ONNX QuantizeLinear / DequantizeLinear, :mod:`.onnx_qdq`), and :func:`save_graph` /
:func:`load_graph` for any Graph without pickle. The ``onnx`` package (dev extra) is needed
only by the ONNX functions.
"""

from . import onnx_ops  # noqa: F401 - registers every op's ONNX mapping on the registry
from .onnx_export import EXPORT_OPSET, export_onnx, graph_to_onnx
from .onnx_import import StaticInputError, import_onnx, supported_onnx_ops
from .onnx_ops import register_onnx, support_table
from .serialize import load_graph, save_graph

__all__ = [
    "EXPORT_OPSET", "StaticInputError", "export_onnx", "graph_to_onnx", "import_onnx",
    "load_graph", "register_onnx", "save_graph", "support_table", "supported_onnx_ops",
]

# --- inference passes, quantisation, pruning, distillation ---------------------------------------
from . import (  # noqa: E402, F401 - onnx_qdq: the QuantizeLinear / DequantizeLinear export
    distill,
    int8_kernels,
    obfuscate,
    onnx_qdq,
    passes,
    prune,
    quantize,
)
from .distill import distillation_loss  # noqa: E402
from .int8_kernels import lower_qdq  # noqa: E402
from .obfuscate import obfuscate as obfuscate_model  # noqa: E402
from .passes import (  # noqa: E402
    collapse_affine,
    compare,
    fold_batch_norm,
    remove_dropout,
    to_inference,
)
from .prune import CSRMatrix, csr_matmul, magnitude_masks, prune_channels  # noqa: E402
from .quantize import calibrate, prepare_qat, qat_to_qdq, quantize_static  # noqa: E402

__all__ += [
    "CSRMatrix", "calibrate", "collapse_affine", "compare", "csr_matmul", "distill",
    "distillation_loss", "fold_batch_norm", "int8_kernels", "lower_qdq", "magnitude_masks",
    "obfuscate", "obfuscate_model", "passes", "prepare_qat", "prune", "prune_channels",
    "qat_to_qdq", "quantize", "quantize_static", "remove_dropout", "to_inference",
]
