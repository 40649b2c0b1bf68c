"""Per-example gradients by expanded weights: one backward pass for a whole batch.

DP-SGD clips every example's gradient before summing, so it needs the ``B`` gradients of a
batch separately, not their sum. Looping ``B`` single-example backward passes works but costs
``B`` tape walks. The *expanded-weights* trick gets them from one: every parameter ``p`` is
tiled to ``B`` copies ``P[i] = p`` (a new leaf of shape ``(B, ...)``), example ``i`` is fed
through its own copy as a batch of one (the extra leading axis broadcasts through ``matmul``
and every element-wise op), and the loss summed over examples is differentiated once: since
``P[i]`` touches only example ``i``'s loss, ``d sum / d P[i]`` is exactly example ``i``'s
gradient.

Contract for ``f(params, *example)`` (the parameters first by default; ``argnums`` moves them): it
is written for **a batch of one** (every example argument keeps a leading axis of size 1, e.g.
``x`` of shape ``(1, 64)``) and returns that example's loss (a scalar, or an array of size 1, e.g.
a sum over ``axis=-1``). It may use any op that broadcasts over leading axes (``matmul``, element-
wise ops, activations, ``log_softmax``/reductions over trailing axes); it must not reduce over
*all* axes (``.sum()`` with no axis, ``.mean()``) or index the leading axis, which would mix
examples — that is detected where it changes the output's shape and reported as a
:class:`ShapeError`.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from . import dtypes
from .autodiff import value_and_grad
from .pytree import flatten, unflatten
from .tensor import Tensor, as_tensor

__all__ = ["per_example_grad"]

_WHERE = "per_example_grad"


def _array(x, what):
    if isinstance(x, Tensor):
        return x.data
    if isinstance(x, (np.ndarray, np.generic, int, float, list, tuple)):
        return np.asarray(x)
    raise DTypeError(f"{_WHERE}: {what} must be an array or Tensor, got {type(x).__name__}")


def per_example_grad(f, argnums=0, *, return_loss=False):
    """Per-example gradients of ``f``, in one backward pass for the whole batch (JAX-style:
    like :func:`ml.grad`, it returns a function).

    Args:
        f: ``f(*args) -> loss`` written for a batch of one (module docstring); argument
            ``argnums`` holds the parameters, every other argument is one example's data.
        argnums: which argument of ``f`` holds the parameters (a pytree: dict, list, tuple of
            float arrays or Tensors).
        return_loss: the returned function also returns the ``(B,)`` per-example losses.

    Returns:
        ``g(*args)``: ``f``'s arguments, with every example argument carrying a common leading
        batch axis ``B``; it returns the gradients in the structure of the parameters, each
        leaf of shape ``(B, *leaf.shape)`` (numpy arrays); with ``return_loss``,
        ``(grads, losses)``.

    Raises (when ``g`` is called):
        ArgumentError: no examples, or examples with different batch sizes.
        DTypeError: a non-float parameter.
        ShapeError: ``f`` does not return one loss per example (it reduced or indexed across
            the batch axis).
    """
    if not callable(f):
        raise ArgumentError(f"{_WHERE}: f must be callable, got {type(f).__name__}")
    if not isinstance(argnums, int) or isinstance(argnums, bool) or argnums < 0:
        raise ArgumentError(f"{_WHERE}: argnums must be one non-negative int (the parameters' "
                            f"argument), got {argnums!r}")

    def per_example(*args):
        if len(args) <= argnums:
            raise ArgumentError(f"{_WHERE}: f's parameters are argument {argnums}, but only "
                                f"{len(args)} argument(s) were given")
        params = args[argnums]
        examples = args[:argnums] + args[argnums + 1:]

        def batch_of_one(p, *xs):
            return f(*xs[:argnums], p, *xs[argnums:])
        return _per_example(batch_of_one, params, examples, return_loss)

    return per_example


def _per_example(f, params, examples, return_loss):
    if not examples:
        raise ArgumentError(f"{_WHERE}: give at least one example array (the batch)")
    arrays = [_array(e, f"example {i}") for i, e in enumerate(examples)]
    if any(a.ndim == 0 for a in arrays):
        raise ShapeError(f"{_WHERE}: examples need a leading batch axis, got shapes "
                         f"{[a.shape for a in arrays]}")
    batch = arrays[0].shape[0]
    if batch == 0 or any(a.shape[0] != batch for a in arrays):
        raise ArgumentError(f"{_WHERE}: examples must share a batch size >= 1, got shapes "
                            f"{[a.shape for a in arrays]}")
    leaves, tree = flatten(params)
    leaves = [_array(p, "a parameter") for p in leaves]
    for p in leaves:
        if not dtypes.is_float(as_tensor(p).dtype):
            raise DTypeError(f"{_WHERE}: parameters must be floating point, got {p.dtype} of "
                             f"shape {p.shape}")
    # The rank every array has in the batch-of-one program; each parameter and example gets the
    # batch axis in front and enough unit axes that it lines up with the activations.
    rank = max([a.ndim for a in arrays] + [p.ndim for p in leaves])
    expanded = [np.ascontiguousarray(np.broadcast_to(
        p.reshape((1,) * (1 + rank - p.ndim) + p.shape), (batch,) + (1,) * (rank - p.ndim)
        + p.shape)) for p in leaves]
    batched = [a.reshape((batch, 1) + a.shape[1:]) for a in arrays]

    def total(expanded_leaves, *xs):
        loss = f(unflatten(tree, list(expanded_leaves)), *xs)
        loss = as_tensor(loss, op=_WHERE)
        if loss.size != batch or (loss.ndim and loss.shape[0] != batch):
            raise ShapeError(
                f"{_WHERE}: f must return one loss per example (a scalar or size-1 result for "
                f"a batch of one); with {batch} examples expanded it returned shape "
                f"{tuple(loss.shape)}: it reduced or indexed across the batch axis (use "
                f"reductions over trailing axes, e.g. sum(axis=-1))")
        total.losses = np.asarray(loss.data).reshape(batch)
        return loss.sum()

    _, grads = value_and_grad(total)(expanded, *batched)
    out = [np.asarray(g.data if isinstance(g, Tensor) else g).reshape((batch,) + p.shape)
           for g, p in zip(grads, leaves)]
    result = unflatten(tree, out)
    return (result, total.losses) if return_loss else result
