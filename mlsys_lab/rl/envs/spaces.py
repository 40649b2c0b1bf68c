"""Gymnasium's spaces, the three the chapter needs: :class:`Box`, :class:`Discrete` and
:class:`MultiDiscrete` (what a vector environment's batched discrete actions are).

A space knows its shape and dtype, says whether a value belongs to it (:meth:`Space.contains`)
and draws one (:meth:`Space.sample`) from its own generator, seeded by :meth:`Space.seed` as
Gymnasium seeds it (``numpy.random.Generator(PCG64(SeedSequence(seed)))``).
"""

import numpy as np

from ...errors import ArgumentError, ShapeError
from .seeding import np_random


class Space:
    """A set of values with a shape, a dtype and a random generator for :meth:`sample`."""

    def __init__(self, shape, dtype, seed=None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._np_random = None
        if seed is not None:
            self.seed(seed)

    @property
    def np_random(self):
        """The space's generator (seeded at random on first use, as in Gymnasium)."""
        if self._np_random is None:
            self.seed(None)
        return self._np_random

    def seed(self, seed=None):
        """Reseed the sampling generator; returns the seed used (drawn when ``seed`` is None)."""
        self._np_random, used = np_random(seed)
        return used

    def contains(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def __contains__(self, x):
        return self.contains(x)


class Discrete(Space):
    """The integers ``start, start + 1, ..., start + n - 1``.

    Args:
        n: how many values (>= 1).
        start: the smallest value.
        seed: seed of :meth:`sample`'s generator.
    """

    def __init__(self, n, start=0, seed=None):
        if int(n) != n or n < 1:
            raise ArgumentError(f"Discrete: n must be a positive integer, got {n!r}")
        self.n = int(n)
        self.start = int(start)
        super().__init__((), np.int64, seed)

    def sample(self):
        """A uniformly drawn value (a numpy int64)."""
        return np.int64(self.start + self.np_random.integers(self.n))

    def contains(self, x):
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            v = int(x)
        elif isinstance(x, np.ndarray) and x.shape == () and np.issubdtype(x.dtype, np.integer):
            v = int(x)
        else:
            return False
        return self.start <= v < self.start + self.n

    def __repr__(self):
        start = "" if self.start == 0 else f", start={self.start}"
        return f"Discrete({self.n}{start})"

    def __eq__(self, other):
        return isinstance(other, Discrete) and (other.n, other.start) == (self.n, self.start)

    def __hash__(self):
        return hash(("Discrete", self.n, self.start))


class MultiDiscrete(Space):
    """A vector of independent discrete values, entry ``i`` in ``0 .. nvec[i] - 1``.

    Args:
        nvec: the number of values of each entry (an array of positive integers).
        seed: seed of :meth:`sample`'s generator.
    """

    def __init__(self, nvec, seed=None):
        self.nvec = np.asarray(nvec, dtype=np.int64)
        if self.nvec.size == 0 or (self.nvec < 1).any():
            raise ArgumentError(f"MultiDiscrete: nvec must hold positive integers, got {nvec!r}")
        super().__init__(self.nvec.shape, np.int64, seed)

    def sample(self):
        """Each entry drawn uniformly from its range."""
        return self.np_random.integers(self.nvec).astype(np.int64)

    def contains(self, x):
        x = np.asarray(x)
        return (x.shape == self.shape and np.issubdtype(x.dtype, np.integer)
                and bool(((x >= 0) & (x < self.nvec)).all()))

    def __repr__(self):
        return f"MultiDiscrete({self.nvec.tolist()})"


class Box(Space):
    """Real arrays of a fixed shape with each entry in ``[low, high]`` (bounds may be infinite).

    Args:
        low: lower bounds (a scalar or an array of ``shape``).
        high: upper bounds (a scalar or an array of ``shape``).
        shape: the arrays' shape; taken from ``low`` when it is an array and shape is None.
        dtype: the arrays' dtype (float32 by default, as Gymnasium).
        seed: seed of :meth:`sample`'s generator.
    """

    def __init__(self, low, high, shape=None, dtype=np.float32, seed=None):
        if shape is None:
            shape = np.shape(low) if np.ndim(low) else np.shape(high)
        low = np.broadcast_to(np.asarray(low, dtype=np.float64), shape)
        high = np.broadcast_to(np.asarray(high, dtype=np.float64), shape)
        if np.shape(low) != tuple(shape) or (low > high).any():
            raise ShapeError(f"Box: low {low} and high {high} do not make a box of shape {shape}")
        super().__init__(shape, dtype, seed)
        self.low = low.astype(self.dtype)
        self.high = high.astype(self.dtype)

    def sample(self):
        """Uniform over bounded entries, normal / exponential-shifted over unbounded ones
        (Gymnasium's rule)."""
        low, high = self.low.astype(np.float64), self.high.astype(np.float64)
        out = np.empty(self.shape)
        both = np.isfinite(low) & np.isfinite(high)
        below = np.isfinite(low) & ~np.isfinite(high)
        above = ~np.isfinite(low) & np.isfinite(high)
        neither = ~np.isfinite(low) & ~np.isfinite(high)
        rng = self.np_random
        out[neither] = rng.normal(size=neither[neither].shape)
        out[below] = low[below] + rng.exponential(size=below[below].shape)
        out[above] = high[above] - rng.exponential(size=above[above].shape)
        out[both] = rng.uniform(low[both], high[both])
        return out.astype(self.dtype)

    def contains(self, x):
        x = np.asarray(x)
        return (x.shape == self.shape and np.can_cast(x.dtype, self.dtype, "same_kind")
                and bool(np.all((x >= self.low) & (x <= self.high))))

    def __repr__(self):
        return f"Box({self.low.min()}, {self.high.max()}, {self.shape}, {self.dtype})"
