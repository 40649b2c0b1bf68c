"""Embedding layers, ``Embedding`` (a lookup) and ``EmbeddingBag`` (sum / mean pooling over
variable-length id lists), with PyTorch's semantics, including its ``sparse=`` flag: the
table's gradient is a dense Tensor (``sparse=False``, the default) or a row-sparse
:class:`~mlsys_lab.engine.sparse.RowSparse` of the touched rows (``sparse=True``), decided by
the flag alone (the ``sparse`` attribute of the ``embedding`` / ``embedding_bag`` op each
layer calls; :mod:`mlsys_lab.engine.ops_embedding` says where a row-sparse gradient cannot go
and is refused)."""

import numpy as np

from .. import ops
from ..engine.ops_embedding import MODES, embedding, embedding_bag
from ..engine.tensor import Tensor
from ..errors import ArgumentError, DTypeError, RankError
from ..kernels import embedding as _kernels  # noqa: F401 - registers the embedding-bag kernel
from . import init
from .layers import check_sizes
from .module import Module, Parameter


def _flag(layer, value, name="sparse"):
    if not isinstance(value, (bool, np.bool_)):
        raise DTypeError(f"{layer}: {name} must be True or False, got {value!r}")
    return bool(value)


class Embedding(Module):
    """A lookup table: integer ids of any shape -> rows of ``weight`` (``(*ids.shape, dim)``).

    Args:
        num_embeddings, embedding_dim: the table's shape.
        rng: seed or Generator of the N(0, 1) initial rows.
        sparse: ``True``: ``weight.grad`` is a :class:`~mlsys_lab.engine.sparse.RowSparse` of
            the touched rows (``ml.optim.SGD``, ``Adagrad`` and ``SparseAdam`` update only
            those rows; the other optimisers refuse it). ``False`` (the default): a dense
            table, which every optimiser takes and which can be traced, compiled and
            differentiated again (a ``sparse=True`` table's gradient cannot: that raises an
            ``ArgumentError`` naming the op and the flag).

    Ids may be int32 or int64 and must lie in ``[0, num_embeddings)``: as in PyTorch, a
    negative id is an error (an ``ArgumentError`` naming the id and the table's rows, eager or
    compiled), not a row counted from the end.
    """

    def __init__(self, num_embeddings, embedding_dim, rng=None, sparse=False):
        super().__init__()
        check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.weight = Parameter(init.normal((num_embeddings, embedding_dim), rng, std=1.0))
        self.sparse = _flag("Embedding", sparse)

    def forward(self, ids):
        return embedding(self.weight, ids, sparse=self.sparse)


class EmbeddingBag(Module):
    """Pooled lookups over bags of ids (``torch.nn.EmbeddingBag``): output row ``b`` is the sum
    or mean of the table rows ``ids[offsets[b]:offsets[b+1]]``; an empty bag gives zeros.

    Call it with a 1-D ``ids`` and ``offsets`` (variable-length bags), or with a 2-D ``ids`` of
    shape ``(bags, length)`` and no offsets (every bag of the same length). ``forward``'s
    ``per_sample_weights`` (``mode="sum"`` only, the shape of ``ids``) scale each id's row
    before the sum, and get a gradient of their own.

    Args:
        num_embeddings, embedding_dim: the table's shape.
        mode: ``"sum"`` or ``"mean"`` (PyTorch's default).
        sparse: ``True``: a row-sparse ``weight.grad``; ``False`` (the default): a dense one
            (see :class:`Embedding`).
        rng: seed or Generator of the N(0, 1) initial rows.
        weight: an initial ``(num_embeddings, embedding_dim)`` array instead (copied).
        include_last_offset: 1-D calls pass ``len(offsets) = bags + 1`` offsets, the last one
            ``len(ids)`` (CSR style), as ``torch.nn.EmbeddingBag``'s.
    """

    def __init__(self, num_embeddings, embedding_dim, mode="mean", sparse=False, rng=None,
                 weight=None, include_last_offset=False):
        super().__init__()
        check_sizes("EmbeddingBag", num_embeddings=num_embeddings,
                             embedding_dim=embedding_dim)
        if mode not in MODES:
            raise ArgumentError(f"EmbeddingBag: mode must be one of {MODES}, got {mode!r}")
        self.mode, self.sparse = mode, _flag("EmbeddingBag", sparse)
        self.include_last_offset = _flag("EmbeddingBag", include_last_offset,
                                         "include_last_offset")
        if weight is None:
            weight = init.normal((num_embeddings, embedding_dim), rng, std=1.0)
        weight = np.array(weight, dtype=np.float32 if np.asarray(weight).dtype.kind != "f"
                          else np.asarray(weight).dtype)
        if weight.shape != (num_embeddings, embedding_dim):
            raise ArgumentError(f"EmbeddingBag: weight must have shape ({num_embeddings}, "
                                f"{embedding_dim}), got {weight.shape}")
        self.weight = Parameter(weight)

    def forward(self, ids, offsets=None, per_sample_weights=None):
        ids = ids if isinstance(ids, Tensor) else Tensor._wrap(np.asarray(ids))
        psw = per_sample_weights
        if psw is not None:
            psw = psw if isinstance(psw, Tensor) else Tensor._wrap(np.asarray(psw))
            if tuple(psw.shape) != tuple(ids.shape):
                raise RankError(f"EmbeddingBag: per_sample_weights must have the shape of ids "
                                f"{tuple(ids.shape)}, got {tuple(psw.shape)}")
        last = self.include_last_offset
        if offsets is None:
            if ids.ndim != 2:
                raise RankError(f"EmbeddingBag: without offsets ids must be 2-D (bags, "
                                f"length), got shape {tuple(ids.shape)}")
            bags, length = ids.shape
            offsets = np.arange(bags, dtype=np.int64) * length
            ids = ops.reshape(ids, (bags * length,))
            psw = None if psw is None else ops.reshape(psw, (bags * length,))
            last = False
        elif ids.ndim != 1:
            raise RankError(f"EmbeddingBag: with offsets ids must be 1-D, got shape "
                            f"{tuple(ids.shape)}")
        return embedding_bag(self.weight, ids, offsets, self.mode, self.sparse,
                             per_sample_weights=psw, include_last_offset=last)


__all__ = ["Embedding", "EmbeddingBag"]
