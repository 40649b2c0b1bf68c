"""Synthetic, seeded recommendation data with a Zipf popularity law: a click log for CTR
ranking (13 dense features plus categorical ids, as in Criteo's layout) and user-item
interactions for retrieval. Labels come from a hidden model, so a model can learn them."""

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError


def zipf_sampler(num_ids, skew, rng, shuffle=True):
    """``(draw, popularity)``: ``draw(k)`` samples ``k`` ids with ``P(rank r) ~ 1 / r^skew``;
    with ``shuffle`` the hot ids are scattered over ``[0, num_ids)`` rather than being 0, 1, ...

    ``popularity[i]`` is the probability of id ``i``.
    """
    if num_ids < 1 or skew < 0:
        raise ArgumentError(f"zipf_sampler: need num_ids >= 1 and skew >= 0, got {num_ids}, "
                            f"{skew}")
    p = 1.0 / np.arange(1, num_ids + 1) ** skew
    p /= p.sum()
    cdf = np.cumsum(p)
    cdf[-1] = 1.0
    ids = rng.permutation(num_ids) if shuffle else np.arange(num_ids)
    popularity = np.empty(num_ids)
    popularity[ids] = p

    def draw(k):
        return ids[np.searchsorted(cdf, rng.random(k), side="right")]

    return draw, popularity


@dataclass
class ClickLog:
    """A click log: ``dense`` (n, 13) float32, ``ids`` one (n, bag) int64 array per table,
    ``labels`` (n,) float32 clicks, and each table's id popularity.

    ``probability`` (n,) float64, when known, is each sample's click probability under the
    model that drew its label (``synthetic_click_log`` fills it in): the best any model of the
    log can predict, e.g. for the ceiling of a model's AUC and log loss."""

    dense: np.ndarray
    ids: list
    labels: np.ndarray
    popularity: list
    probability: np.ndarray = None

    def __len__(self):
        return self.labels.shape[0]

    def batch(self, index):
        """``(dense, [ids per table], labels)`` of the samples ``index``."""
        return self.dense[index], [t[index] for t in self.ids], self.labels[index]

    def batches(self, batch_size, rng=None):
        """Consecutive (or, with ``rng``, shuffled) batches covering the log once."""
        order = np.arange(len(self)) if rng is None else rng.permutation(len(self))
        for start in range(0, len(self) - batch_size + 1, batch_size):
            yield self.batch(order[start:start + batch_size])


def synthetic_click_log(num_samples, table_sizes, num_dense=13, bag_size=1, skew=1.05,
                        ctr=0.25, hidden_dim=4, seed=0):
    """A seeded click log whose clicks follow a hidden factorisation-machine-like model.

    The hidden logit of a sample is a linear term of its dense features, a bias per id and
    dot products between the hidden vectors of its ids in different tables; shifted so about
    ``ctr`` of the samples have a logit above 0, it gives the click probability
    ``1 / (1 + exp(-2 logit))`` (kept in ``ClickLog.probability``), with which each label is
    drawn.

    Args:
        num_samples: rows of the log.
        table_sizes: the number of ids of each categorical feature.
        num_dense: dense features.
        bag_size: ids per table per sample (a multi-hot feature when > 1).
        skew: the Zipf exponent of id popularity.
        seed: everything is drawn from ``numpy.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((num_samples, num_dense)).astype(np.float32)
    logit = dense @ (rng.standard_normal(num_dense) * 0.5 / np.sqrt(num_dense))
    ids, popularity, vecs = [], [], []
    for size in table_sizes:
        draw, pop = zipf_sampler(size, skew, rng)
        t = draw(num_samples * bag_size).reshape(num_samples, bag_size)
        bias = rng.standard_normal(size) * 0.5
        vec = rng.standard_normal((size, hidden_dim)) * 0.5
        ids.append(t.astype(np.int64))
        popularity.append(pop)
        logit = logit + bias[t].mean(1)
        vecs.append(vec[t].mean(1))
    for a in range(len(vecs)):
        for b in range(a):
            logit = logit + np.sum(vecs[a] * vecs[b], axis=1)
    logit = logit - np.quantile(logit, 1 - ctr)  # about ctr of the samples above 0.5
    probability = 1 / (1 + np.exp(-2 * logit))
    labels = (rng.random(num_samples) < probability).astype(np.float32)
    return ClickLog(dense, ids, labels, popularity, probability)


@dataclass
class Interactions:
    """User-item interactions for retrieval: ``train`` (m, 2) pairs (user, item), ``test``
    one set of held-out items per user, and item popularity.

    When the generator is known (``synthetic_interactions`` fills them in), ``user_vectors``
    (num_users, d), ``item_vectors`` (num_items, d) and ``temperature`` are its hidden model:
    user ``u`` picks item ``i`` with probability ~ ``popularity[i] exp(<u, v_i> /
    temperature)``, and :meth:`hidden_scores` ranks items by that log probability."""

    num_users: int
    num_items: int
    train: np.ndarray
    test: list
    popularity: np.ndarray
    user_vectors: np.ndarray = None
    item_vectors: np.ndarray = None
    temperature: float = None

    def hidden_scores(self, users):
        """``(len(users), num_items)`` log probabilities, up to a constant per user, with which
        the hidden model picks items: ``log(popularity) + <u, v> / temperature``. Ranking by
        them (skipping the items already picked) is the best retrieval of these data."""
        if self.user_vectors is None or self.item_vectors is None or self.temperature is None:
            raise ArgumentError("Interactions.hidden_scores: these interactions carry no "
                                "hidden model (user_vectors, item_vectors, temperature)")
        u = self.user_vectors[np.asarray(users)]
        return u @ self.item_vectors.T / self.temperature + np.log(self.popularity)


def synthetic_interactions(num_users=2000, num_items=5000, per_user=20, held_out=5, dim=8,
                           skew=1.0, temperature=0.5, seed=0):
    """Users pick items with probability ~ popularity x exp(<u, v> / temperature) for hidden
    unit vectors u, v; the last ``held_out`` distinct picks of each user are the test set."""
    rng = np.random.default_rng(seed)
    _, pop = zipf_sampler(num_items, skew, rng)
    u = rng.standard_normal((num_users, dim))
    v = rng.standard_normal((num_items, dim))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    pairs, test = [], []
    for user in range(num_users):
        logits = v @ u[user] / temperature + np.log(pop)
        p = np.exp(logits - logits.max())
        items = rng.choice(num_items, per_user + held_out, replace=False, p=p / p.sum())
        pairs.append(np.stack([np.full(per_user, user), items[:per_user]], 1))
        test.append(set(items[per_user:].tolist()))
    return Interactions(num_users, num_items, np.concatenate(pairs).astype(np.int64), test, pop,
                        u, v, temperature)


__all__ = ["zipf_sampler", "ClickLog", "synthetic_click_log", "Interactions",
           "synthetic_interactions"]
