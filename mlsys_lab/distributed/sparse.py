"""The row-sparse gradient type, :class:`~mlsys_lab.engine.sparse.RowSparse`.

It lives in the engine (the tape produces it for sparse embedding lookups); this module keeps
the parameter server's import path ``mlsys_lab.distributed.sparse.RowSparse``.
"""

from ..engine.sparse import RowSparse

__all__ = ["RowSparse"]
