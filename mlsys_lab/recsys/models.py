"""The two models of a recommender's pipeline: a small DLRM for ranking (bottom MLP on dense
features, embedding bags for categorical ones, pairwise dot interaction, top MLP) and a
two-tower retriever trained with in-batch negatives."""

import numpy as np

from .. import nn, ops
from ..engine.tensor import Tensor
from ..errors import ArgumentError, ShapeError


def mlp(sizes, rng, last_relu=True):
    """``Linear(sizes[0], sizes[1]) -> ReLU -> ...``; ReLU after the last one if ``last_relu``."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, rng=rng))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dot_interaction(features):
    """Pairwise dot products of ``F`` feature vectors (each ``(B, D)``), keeping the strictly
    lower triangle of the ``F x F`` matrix: ``(B, F (F - 1) / 2)`` (DLRM's "dot" interaction;
    the diagonal and the mirrored half would repeat or add nothing)."""
    F = len(features)
    z = ops.stack(features, axis=1)  # (B, F, D)
    zz = z @ ops.transpose(z, (0, 2, 1))  # (B, F, F)
    rows, cols = np.tril_indices(F, k=-1)
    return ops.take(ops.reshape(zz, (zz.shape[0], F * F)), rows * F + cols, axis=1)


def bce_with_logits(logits, labels):
    """Mean binary cross-entropy of ``labels`` under ``sigmoid(logits)``, computed stably:
    ``max(z, 0) - z y + log(1 + exp(-|z|))``."""
    z = ops.reshape(logits, (-1,))
    y = labels if isinstance(labels, Tensor) else Tensor(np.asarray(labels, z.dtype))
    return ops.mean(ops.relu(z) - z * y + ops.log(1.0 + ops.exp(-ops.abs(z))))


def sigmoid_np(z):
    """The click probability of a logit (numpy, stable on both tails)."""
    z = np.asarray(z, np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


class DLRM(nn.Module):
    """Deep Learning Recommendation Model (Naumov et al., 2019), small.

    Args:
        table_sizes: rows of each embedding table (the book's setting: 8 tables of 10^5).
        dim: embedding dimension (16); the bottom MLP ends at it.
        num_dense: dense features (13, Criteo's).
        bottom: hidden sizes of the bottom MLP (13 -> 64 -> 16).
        top: hidden sizes of the top MLP before its single logit.
        sparse: the tables' ``EmbeddingBag(sparse=)`` flag. ``True`` (the default, as big
            tables are trained): each table's gradient is a RowSparse of the rows the batch
            touched, for ``SparseAdam`` / ``Adagrad`` / ``SGD`` row updates or a parameter
            server's push. ``False``: dense table gradients (any optimiser; a traced or
            compiled training step, ``create_graph=True``, which refuse a row-sparse one).
        rng: seed of the initial weights.
    """

    def __init__(self, table_sizes=(10 ** 5,) * 8, dim=16, num_dense=13, bottom=(64,),
                 top=(64, 32), sparse=True, rng=0):
        super().__init__()
        rng = np.random.default_rng(rng)
        self.dim, self.num_tables = dim, len(table_sizes)
        self.bottom = mlp([num_dense, *bottom, dim], rng)
        self.tables = nn.Sequential(*[
            nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse,
                            weight=(rng.uniform(-1, 1, (n, dim)) / np.sqrt(n)).astype(np.float32))
            for n in table_sizes])
        f = len(table_sizes) + 1
        self.top = mlp([dim + f * (f - 1) // 2, *top, 1], rng, last_relu=False)

    def forward(self, dense, ids):
        """Logits ``(B,)`` for dense features ``(B, num_dense)`` and one ``(B, bag)`` id array
        per table."""
        if len(ids) != self.num_tables:
            raise ArgumentError(f"DLRM: got ids for {len(ids)} tables, the model has "
                                f"{self.num_tables}")
        x = self.bottom(dense if isinstance(dense, Tensor) else Tensor(
            np.asarray(dense, np.float32)))
        embs = [table(t) for table, t in zip(self.tables, ids)]
        z = ops.concatenate([x, dot_interaction([x, *embs])], axis=1)
        return ops.reshape(self.top(z), (-1,))

    def embedding_parameters(self):
        """The tables' weights (what the parameter server holds)."""
        return [t.weight for t in self.tables]

    def dense_parameters(self):
        """The MLPs' weights (replicated on every worker)."""
        return list(self.bottom.parameters()) + list(self.top.parameters())


def _top_k_stable(scores, k):
    """Per row, the indices of the ``k`` largest scores, largest first, equal scores in index
    order (what a stable argsort of ``-scores`` gives), without sorting whole rows."""
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]  # each row's k-th largest score
    top = np.empty((scores.shape[0], k), np.int64)
    for i, row in enumerate(scores):
        cand = np.flatnonzero(row >= kth[i])  # at least k, in index order
        top[i] = cand[np.argsort(-row[cand], kind="stable")[:k]]
    return top


def l2_normalize(x, eps=1e-12):
    """Rows of ``x`` scaled to unit length."""
    return x / ops.sqrt(ops.sum(x * x, axis=1, keepdims=True) + eps)


class TwoTower(nn.Module):
    """A two-tower retriever: a user tower and an item tower map ids to unit vectors whose dot
    product scores the pair, so all items can be embedded once and retrieved by nearest
    neighbour.

    Args:
        num_users, num_items: id ranges.
        dim: embedding size; out: the towers' output size.
        temperature: the softmax temperature of the in-batch loss.
        sparse: the id embeddings' ``Embedding(sparse=)`` flag: ``True`` (the default) a
            RowSparse gradient of the touched rows, ``False`` a dense one (see :class:`DLRM`).
    """

    def __init__(self, num_users, num_items, dim=32, out=16, temperature=0.1, sparse=True,
                 rng=0):
        super().__init__()
        rng = np.random.default_rng(rng)
        self.temperature = temperature
        self.user_emb = nn.Embedding(num_users, dim, rng=rng, sparse=sparse)
        self.item_emb = nn.Embedding(num_items, dim, rng=rng, sparse=sparse)
        self.user_mlp = mlp([dim, dim, out], rng, last_relu=False)
        self.item_mlp = mlp([dim, dim, out], rng, last_relu=False)

    def users(self, ids):
        """Unit user vectors ``(len(ids), out)``."""
        return l2_normalize(self.user_mlp(self.user_emb(np.asarray(ids))))

    def items(self, ids):
        """Unit item vectors ``(len(ids), out)``."""
        return l2_normalize(self.item_mlp(self.item_emb(np.asarray(ids))))

    def in_batch_loss(self, users, items, log_q=None):
        """Softmax cross-entropy where each user's clicked item is the positive and the other
        items of the batch are its negatives (logits ``U V^T / temperature``).

        A popular item turns up as somebody's negative in many batches, so plain in-batch
        training pushes popular items down. ``log_q`` (the log of each item's probability of
        being in a batch, e.g. its training frequency) subtracts that sampling bias from every
        column of the logits (the "logQ correction" of Yi et al., 2019)."""
        logits = self.users(users) @ ops.transpose(self.items(items)) / self.temperature
        if log_q is not None:
            logits = logits - Tensor(np.asarray(log_q, logits.dtype)[np.asarray(items)])
        return ops.cross_entropy(logits, np.arange(len(users)))

    def retrieve(self, users, k, exclude=None, prior=None):
        """The ``k`` best items for each user, best first (brute-force nearest neighbours),
        skipping ``exclude[i]`` (e.g. items seen in training) for user ``i``.

        Items are ranked by the dot product of the towers' vectors, or, with ``prior`` (one
        log probability per item, e.g. the log of its popularity), by the logits
        ``<u, v> / temperature + prior[item]``: the towers' logits in the scale the in-batch
        loss trained them, plus a serving-time prior. Equal scores keep item order (the lower
        id first).

        Raises:
            ArgumentError: ``k`` is not between 1 and the number of items, or ``prior`` holds
                a value that is not finite.
            ShapeError: ``prior`` is not one number per item.
        """
        from ..engine.dispatch import no_grad

        num_items = self.item_emb.weight.shape[0]
        if not 1 <= k <= num_items:
            raise ArgumentError(f"TwoTower.retrieve: k={k}, need 1 <= k <= {num_items} items")
        if prior is not None:
            prior = np.asarray(prior, np.float64)
            if prior.shape != (num_items,):
                raise ShapeError(f"TwoTower.retrieve: prior has shape {prior.shape}, need one "
                                 f"log probability per item: ({num_items},)")
            if not np.all(np.isfinite(prior)):
                raise ArgumentError("TwoTower.retrieve: prior must be finite (a log probability "
                                 "per item; leave an item out with exclude)")
        with no_grad():
            v = self.items(np.arange(num_items)).numpy()
            u = self.users(users).numpy()
        scores = u @ v.T
        if prior is not None:
            scores = scores / self.temperature + prior
        if exclude is not None:
            for i, seen in enumerate(exclude):
                scores[i, list(seen)] = -np.inf
        return _top_k_stable(scores, k)

    def embedding_parameters(self):
        return [self.user_emb.weight, self.item_emb.weight]

    def dense_parameters(self):
        return list(self.user_mlp.parameters()) + list(self.item_mlp.parameters())


__all__ = ["DLRM", "TwoTower", "dot_interaction", "bce_with_logits", "sigmoid_np", "mlp",
           "l2_normalize"]
