"""The ONNX mapping of each op, stored on its registry record (``Op.onnx``).

One :func:`register_onnx` call per op says how a node of it is written to ONNX (``export``)
and which ONNX op types read back into it (``imports``); nothing here is a table keyed by op
names, and the ONNX-type lookup is derived by scanning the registry
(:func:`~.onnx_import.importers`). The records and shared helpers live in
:mod:`.onnx_mapping`; the calls, by op family, in :mod:`.onnx_ops_elementwise`,
:mod:`.onnx_ops_shape` and :mod:`.onnx_ops_nn`, which importing this module registers.
A few importers fold their input's producer into one node (``Not(Equal)`` is ``ne``), so that
export then import gives the graph back.
"""

from . import onnx_ops_elementwise, onnx_ops_nn, onnx_ops_shape  # noqa: F401 - register
from .onnx_mapping import (
    OnnxImport,
    OnnxMapping,
    exportable_ops,
    register_onnx,
    support_table,
)

__all__ = ["OnnxImport", "OnnxMapping", "exportable_ops", "register_onnx", "support_table"]
