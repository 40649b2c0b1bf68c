"""mlsys_lab.deploy: from a trained model to an inference model (book chapter 10).

The map (concept → module → book section) is ``mlsys_lab/deploy/README.md``. Subpackages:

* :mod:`.onnx` — interchange: :func:`export_onnx` / :func:`import_onnx`; each op's ONNX mapping
  lives on its registry record (``Op.onnx``, :func:`register_onnx`), and a QDQ graph from
  :mod:`.quant` exports as ONNX QuantizeLinear / DequantizeLinear. The ``onnx`` package (dev
  extra) is needed only to write or read a model;
* :mod:`.quant` — int8 quantisation: the arithmetic, observers, PTQ, QAT, and the Numba int8
  kernels a QDQ graph is lowered onto (:func:`lower_qdq`);
* :mod:`.compress` — pruning (:mod:`.compress.prune`) and distillation
  (:mod:`.compress.distill`).

Modules: :mod:`.passes` (the inference passes: dropout removal, BN folding, affine collapse,
and running a graph as numpy), :mod:`.serialize` (:func:`save_graph` / :func:`load_graph`, any
Graph without pickle) and :mod:`.obfuscate` (a weight-obfuscation demo: model protection).

The public names below keep the package root's API; ``deploy.distill``, ``deploy.prune`` and
``deploy.int8_kernels`` name the modules in the subpackages, as the notebooks import them.
"""

from . import onnx  # noqa: F401 - registers every op's ONNX mapping on the registry
from .onnx import (
    EXPORT_OPSET,
    StaticInputError,
    export_onnx,
    graph_to_onnx,
    import_onnx,
    register_onnx,
    support_table,
    supported_onnx_ops,
)
from .serialize import load_graph, save_graph

__all__ = [
    "EXPORT_OPSET", "StaticInputError", "export_onnx", "graph_to_onnx", "import_onnx",
    "load_graph", "register_onnx", "save_graph", "support_table", "supported_onnx_ops",
]

# --- inference passes, quantisation, pruning, distillation ---------------------------------------
from . import compress, obfuscate, passes, quant  # noqa: E402, F401
from .compress import distill, prune  # noqa: E402
from .compress.distill import distillation_loss  # noqa: E402
from .compress.prune import CSRMatrix, csr_matmul, magnitude_masks, prune_channels  # noqa: E402
from .obfuscate import obfuscate as obfuscate_model  # noqa: E402
from .passes import (  # noqa: E402
    collapse_affine,
    compare,
    fold_batch_norm,
    remove_dropout,
    to_inference,
)
from .quant import (  # noqa: E402
    calibrate,
    int8_kernels,  # noqa: E402
    lower_qdq,
    prepare_qat,
    qat_to_qdq,
    quantize_static,
)

__all__ += [
    "CSRMatrix", "calibrate", "collapse_affine", "compare", "compress", "csr_matmul", "distill",
    "distillation_loss", "fold_batch_norm", "int8_kernels", "lower_qdq", "magnitude_masks",
    "obfuscate", "obfuscate_model", "onnx", "passes", "prepare_qat", "prune", "prune_channels",
    "qat_to_qdq", "quant", "quantize_static", "remove_dropout", "to_inference",
]
