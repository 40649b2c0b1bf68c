"""Tensor (intra-operator) parallelism in the style of Megatron-LM.

A Linear ``y = x @ W + b`` with ``W`` of shape (in, out) can be split two ways over ``size``
ranks:

* by columns (:class:`ColumnParallelLinear`): rank ``r`` holds ``W[:, cols_r]`` and computes
  its slice of ``y`` from the full input; the slices are all-gathered only if the next layer
  needs the whole output. In the backward pass each rank has only a partial ``dx``, so the
  ``dx`` are all-reduced.
* by rows (:class:`RowParallelLinear`): rank ``r`` holds ``W[rows_r, :]`` and the matching slice
  of the input, computes a partial sum of ``y``, and the partial sums are all-reduced.

An MLP ``fc2(act(fc1(x)))`` splits fc1 by columns and fc2 by rows, so the activation works on
local columns and the whole block needs one all-reduce forward and one backward
(:class:`ParallelMLP`). Layer methods are generators run on a communicator:
``y = yield from layer.forward(comm, x)``. Local arithmetic runs on ``mlsys_lab`` tensors and
autodiff; parameters are ``Parameter``\\ s, so any ``ml.optim`` optimiser can update the shards.

A dimension that ``size`` does not divide is split unevenly (:func:`split_bounds`):
``split="array"`` gives the first ``n % size`` ranks one more (``np.array_split``,
``torch.tensor_split``), ``split="chunk"`` gives every rank ``ceil(n / size)`` but the last
ones, which get what is left, possibly nothing (``torch.chunk``). The all-gather of a
column-split output then concatenates slices of different widths. (Megatron instead pads the
dimension to a multiple of ``size``; the padded columns would be zero weights here.)
"""

import numpy as np

from ... import ops
from ...engine.tensor import Tensor
from ...errors import ArgumentError, ShapeError
from ...nn.module import Parameter
from ..collectives import allgather, allreduce, block_bounds

ACTIVATIONS = (None, "relu", "tanh", "sigmoid")


SPLITS = ("array", "chunk")


def split_bounds(n, size, split="array", owner="split_bounds"):
    """``[(lo, hi)]`` of each rank's share of a dimension of ``n`` (module docstring)."""
    if split == "array":
        return block_bounds(n, size)
    if split == "chunk":
        step = -(-n // size)
        return [(min(r * step, n), min((r + 1) * step, n)) for r in range(size)]
    raise ArgumentError(f"{owner}: split={split!r} is not one of {SPLITS}")


def _check_rank(rank, size, owner):
    if not (isinstance(size, (int, np.integer)) and size >= 1 and
            isinstance(rank, (int, np.integer)) and 0 <= rank < size):
        raise ArgumentError(f"{owner}: rank {rank!r} must lie in 0..size-1 (size={size!r})")


def _flops_matmul(x, w):
    return 2.0 * np.prod(x.shape[:-1]) * w.shape[0] * w.shape[1]


class _ParallelLinear:
    """Shared state: the weight/bias shards and what the last forward saved for backward."""

    by_columns = True  # which dimension of the weight the ranks split

    def __init__(self, weight, bias, rank, size, activation, bounds):
        if activation not in ACTIVATIONS:
            raise ArgumentError(f"{type(self).__name__}: activation must be one of "
                                f"{ACTIVATIONS}, got {activation!r}")
        self.weight = Parameter(weight)
        self.bias = None if bias is None else Parameter(bias)
        self.rank, self.size, self.activation = rank, size, activation
        width = self.weight.shape[1 if self.by_columns else 0]
        self.bounds = (rank * width, (rank + 1) * width) if bounds is None else tuple(bounds)
        if self.bounds[1] - self.bounds[0] != width:
            raise ShapeError(f"{type(self).__name__}: bounds={bounds} hold "
                             f"{self.bounds[1] - self.bounds[0]} features but the weight "
                             f"shard has {width} (rank {rank})")
        self._saved = {}  # key (e.g. micro-batch) -> what backward needs

    @classmethod
    def from_linear(cls, linear, rank, size, split="array", **kwargs):
        """Rank ``rank``'s shard of an ``ml.nn.Linear`` (``split``: :func:`split_bounds`)."""
        owner = f"{cls.__name__}.from_linear"
        _check_rank(rank, size, owner)
        n = linear.out_features if cls.by_columns else linear.in_features
        lo, hi = split_bounds(n, size, split, owner)[rank]
        weight = linear.weight.data[:, lo:hi] if cls.by_columns else linear.weight.data[lo:hi]
        bias = None if linear.bias is None else (
            linear.bias.data[lo:hi] if cls.by_columns else linear.bias.data)
        return cls(weight.copy(), None if bias is None else bias.copy(), rank, size,
                   bounds=(lo, hi), **kwargs)

    def parameters(self):
        return [p for p in (self.weight, self.bias) if p is not None]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def _activate(self, y):
        return y if self.activation is None else getattr(ops, self.activation)(y)

    def _saved_output(self, owner, key):
        if key not in self._saved:
            raise ArgumentError(f"{owner}: no forward with key={key!r} to differentiate (call "
                                f"forward first; each forward is differentiated once)")
        return self._saved.pop(key)


class ColumnParallelLinear(_ParallelLinear):
    """Rank ``rank``'s column block of a Linear, optionally followed by an element-wise
    ``activation`` ("relu", "tanh", "sigmoid"), which needs no communication on columns.

    Args:
        weight: this rank's ``(in, hi - lo)`` block; bias: its ``(hi - lo,)`` slice.
        gather_output: all-gather the output slices so every rank gets the full output.
        algo: the all-reduce / all-gather algorithm name passed to the collectives.
        bounds: ``(lo, hi)``, the output columns this rank holds (default: equal shares).
    """

    def __init__(self, weight, bias, rank, size, gather_output=False, activation=None,
                 algo="ring", bounds=None):
        _check_rank(rank, size, "ColumnParallelLinear")
        super().__init__(weight, bias, rank, size, activation, bounds)
        self.gather_output, self.algo = gather_output, algo

    def forward(self, comm, x, key=0):
        """Generator: this rank's output columns (all columns with ``gather_output``).
        ``key`` names this call for :meth:`backward` (several may be in flight)."""
        x = Tensor(np.asarray(x), requires_grad=True)
        y = ops.matmul(x, self.weight)
        y = self._activate(y + self.bias if self.bias is not None else y)
        yield comm.compute(flops=_flops_matmul(x, self.weight))
        self._saved[key] = (x, y)
        local = y.numpy()
        if not self.gather_output or self.size == 1:
            return local
        columns = np.ascontiguousarray(np.moveaxis(local, -1, 0))  # slices may differ in width
        gathered = yield from allgather(comm, columns, algo=self.algo)
        return np.moveaxis(gathered, 0, -1)

    def backward(self, comm, dy, key=0):
        """Generator: accumulate this shard's gradients from ``dy`` (this rank's columns, or
        all columns with ``gather_output``) and return the full ``dx`` (all-reduced)."""
        x, y = self._saved_output("ColumnParallelLinear.backward", key)
        dy = np.asarray(dy)
        if self.gather_output and self.size > 1:
            dy = dy[..., self.bounds[0]:self.bounds[1]]
        if dy.shape != tuple(y.shape):
            raise ShapeError(f"ColumnParallelLinear.backward: dy has shape {dy.shape}, expected "
                             f"{tuple(y.shape)} (rank {self.rank})")
        y.backward(Tensor(dy.astype(y.dtype, copy=False)))
        yield comm.compute(flops=2 * _flops_matmul(x, self.weight))
        dx = x.grad.numpy()
        if self.size == 1:
            return dx
        return (yield from allreduce(comm, dx, algo=self.algo))


class RowParallelLinear(_ParallelLinear):
    """Rank ``rank``'s row block of a Linear: input features split, partial sums all-reduced.

    Args:
        weight: this rank's ``(hi - lo, out)`` block; bias: the full ``(out,)`` bias, added
            once after the all-reduce (every rank holds the same copy).
        input_is_parallel: ``x`` is already this rank's slice of features (the output of a
            ColumnParallelLinear); otherwise the full ``x`` is given and sliced here.
        bounds: ``(lo, hi)``, the input features this rank holds (default: equal shares).
    """

    by_columns = False

    def __init__(self, weight, bias, rank, size, input_is_parallel=True, algo="ring",
                 bounds=None):
        _check_rank(rank, size, "RowParallelLinear")
        super().__init__(weight, bias, rank, size, None, bounds)
        self.input_is_parallel, self.algo = input_is_parallel, algo

    def _local_input(self, x):
        rows = self.weight.shape[0]
        if not self.input_is_parallel:
            x = x[..., self.bounds[0]:self.bounds[1]]
        if x.shape[-1] != rows:
            raise ShapeError(f"RowParallelLinear: rank {self.rank} expects {rows} input "
                             f"features, got shape {x.shape}")
        return x

    def forward(self, comm, x, key=0):
        """Generator: the full output ``x @ W + b`` (partial sums all-reduced)."""
        x = Tensor(self._local_input(np.asarray(x)), requires_grad=True)
        partial = ops.matmul(x, self.weight)
        yield comm.compute(flops=_flops_matmul(x, self.weight))
        self._saved[key] = (x, partial)
        out = partial.numpy()
        if self.size > 1:
            out = yield from allreduce(comm, np.ascontiguousarray(out), algo=self.algo)
        return out + self.bias.data if self.bias is not None else out

    def backward(self, comm, dy, key=0):
        """Generator: accumulate this shard's gradients and return ``dx`` for this rank's input
        features (no communication: ``dy`` is the same on every rank)."""
        x, partial = self._saved_output("RowParallelLinear.backward", key)
        dy = np.asarray(dy)
        if dy.shape != tuple(partial.shape):
            raise ShapeError(f"RowParallelLinear.backward: dy has shape {dy.shape}, expected "
                             f"{tuple(partial.shape)} (rank {self.rank})")
        partial.backward(Tensor(dy.astype(partial.dtype, copy=False)))
        if self.bias is not None:
            db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
            self.bias.grad = Tensor(db if self.bias.grad is None else self.bias.grad.numpy() + db)
        yield comm.compute(flops=2 * _flops_matmul(x, self.weight))
        dx = x.grad.numpy()
        return dx


class ParallelMLP:
    """``fc2(act(fc1(x)))`` with fc1 split by columns and fc2 by rows (Megatron's MLP).

    Forward needs one all-reduce (fc2's partial sums), backward one (fc1's ``dx``).
    """

    def __init__(self, fc1, fc2, rank, size, activation="relu", algo="ring", split="array"):
        self.fc1 = ColumnParallelLinear.from_linear(fc1, rank, size, split, activation=activation,
                                                    algo=algo)
        self.fc2 = RowParallelLinear.from_linear(fc2, rank, size, split, algo=algo)

    def parameters(self):
        return self.fc1.parameters() + self.fc2.parameters()

    def zero_grad(self):
        self.fc1.zero_grad()
        self.fc2.zero_grad()

    def forward(self, comm, x, key=0):
        """Generator: the block's full output on every rank."""
        h = yield from self.fc1.forward(comm, x, key)
        return (yield from self.fc2.forward(comm, h, key))

    def backward(self, comm, dy, key=0):
        """Generator: gradients of every shard; returns the full ``dx``."""
        dh = yield from self.fc2.backward(comm, dy, key)
        return (yield from self.fc1.backward(comm, dh, key))

