"""ONNX interchange (book ch. 10, model conversion): :func:`export_onnx` / :func:`import_onnx`.

Each op's ONNX mapping is stored on its registry record (``Op.onnx``). One
:func:`register_onnx` call per op says how a node of it is written to ONNX (``export``) and
which ONNX op types read back into it (``imports``); nothing here is a table keyed by op names,
and the ONNX-type lookup is derived by scanning the registry (:func:`.importer.importers`).

* :mod:`.mapping` — the records (:class:`OnnxMapping`, :class:`OnnxImport`),
  :func:`register_onnx`, the support table and the helpers every op family shares;
* :mod:`.ops_elementwise`, :mod:`.ops_shape`, :mod:`.ops_nn`, :mod:`.ops_attention` — the
  ``register_onnx`` calls by op family, and :mod:`.qdq` — ``quantize_linear`` /
  ``dequantize_linear`` as ONNX QuantizeLinear / DequantizeLinear; importing this package
  registers them all;
* :mod:`.exporter` — a traced function, module or Graph as an ONNX model;
* :mod:`.importer` — an ONNX model as a Graph of registry ops.

A few importers fold their input's producer into one node (``Not(Equal)`` is ``ne``), so that
export then import gives the graph back. The ``onnx`` package (dev extra) is needed only to
write or read a model; the mappings themselves need none.
"""

from . import (  # noqa: F401 - register the mappings
    ops_attention,
    ops_elementwise,
    ops_nn,
    ops_shape,
    qdq,
)
from .exporter import EXPORT_OPSET, export_onnx, graph_to_onnx
from .importer import StaticInputError, import_onnx, supported_onnx_ops
from .mapping import OnnxImport, OnnxMapping, exportable_ops, register_onnx, support_table

__all__ = [
    "EXPORT_OPSET", "OnnxImport", "OnnxMapping", "StaticInputError", "export_onnx",
    "exportable_ops", "graph_to_onnx", "import_onnx", "register_onnx", "support_table",
    "supported_onnx_ops",
]
