"""The parameter server (ch. 11, 参数服务器): keys sharded over server ranks, pull / push of
row-sparse gradients (:class:`RowSparse`, which the engine's tape produces for sparse embedding
lookups), sync / async / bounded staleness, stragglers and hot-key replication
(``param_server``), all rank programs on the simulator.
"""

from ...engine.sparse import RowSparse
from . import param_server
from .param_server import ParameterServer

__all__ = ["ParameterServer", "RowSparse", "param_server"]
