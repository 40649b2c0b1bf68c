"""Pruning (book ch. 10): remove weights, keep accuracy, then run the sparse model.

* unstructured magnitude pruning — :func:`magnitude_masks` zeroes the smallest ``|w|`` to an exact
  sparsity (over all layers at once, or layer by layer), :func:`apply_masks` applies them and
  :func:`fine_tune` retrains the survivors with the pruned weights held at zero;
* structured channel pruning — :func:`prune_channels` removes the output channels (conv
  filters, linear units) of least L1 norm from one layer *and* the matching inputs of the next,
  so the model is physically smaller and dense kernels run it faster;
* a CSR sparse matrix (:class:`CSRMatrix`) and a Numba sparse × dense kernel
  (:func:`csr_matmul`), to measure at what density sparse arithmetic starts to beat dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from ...engine.numba_cache import CACHE
from ...engine.tensor import Tensor
from ...errors import ArgumentError, DTypeError, ShapeError
from ...nn.layers import BatchNorm2d, Conv2d, Flatten, Linear, Sequential
from ...nn.module import Parameter


# --- unstructured magnitude pruning ------------------------------------------------------------
def prunable(model):
    """``{name: Parameter}`` of the weights pruning applies to: every parameter of two or more
    dimensions (linear and conv weights; biases and norms are left dense)."""
    return {n: p for n, p in model.named_parameters() if p.ndim >= 2}


def _check_sparsity(sparsity):
    if not isinstance(sparsity, (int, float, np.floating)) or not 0.0 <= sparsity <= 1.0:
        raise ArgumentError(f"pruning: sparsity must be a number in [0, 1], got {sparsity!r}")
    return float(sparsity)


def _smallest(magnitudes, count):
    """A keep-mask with exactly ``count`` of the smallest entries removed (ties by position)."""
    keep = np.ones(magnitudes.size, bool)
    keep[np.argsort(magnitudes, kind="stable")[:count]] = False
    return keep


def magnitude_masks(model, sparsity, scope="global"):
    """Keep-masks that remove the fraction ``sparsity`` of the weights of least magnitude.

    Args:
        model: an ``nn.Module`` (its :func:`prunable` weights are pruned).
        sparsity: the fraction of weights to remove, in [0, 1]; exactly
            ``round(sparsity * n)`` of them go (``n`` weights in the scope).
        scope: ``"global"`` ranks all weights together (layers with many small weights lose
            more), ``"layer"`` removes the same fraction from every layer.

    Returns:
        ``{name: bool array}``, True where a weight is kept.
    """
    sparsity = _check_sparsity(sparsity)
    weights = {n: p.numpy() for n, p in prunable(model).items()}
    if not weights:
        raise ArgumentError(f"magnitude_masks: {type(model).__name__} has no weight to prune")
    if scope == "layer":
        return {n: _smallest(np.abs(w).ravel(), round(sparsity * w.size)).reshape(w.shape)
                for n, w in weights.items()}
    if scope != "global":
        raise ArgumentError(f"magnitude_masks: scope must be 'global' or 'layer', got {scope!r}")
    flat = np.concatenate([np.abs(w).ravel() for w in weights.values()])
    keep = _smallest(flat, round(sparsity * flat.size))
    masks, start = {}, 0
    for n, w in weights.items():
        masks[n] = keep[start:start + w.size].reshape(w.shape)
        start += w.size
    return masks


def apply_masks(model, masks):
    """Zero the pruned weights of ``model`` in place (``masks`` from :func:`magnitude_masks`)."""
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        if name not in params or params[name].shape != mask.shape:
            raise ShapeError(f"apply_masks: no parameter {name!r} of shape {mask.shape}")
        params[name].data *= mask.astype(params[name].dtype)
    return model


def sparsity_of(model):
    """The fraction of zeros among the :func:`prunable` weights."""
    weights = [p.numpy() for p in prunable(model).values()]
    total = sum(w.size for w in weights)
    return sum(int(np.count_nonzero(w == 0)) for w in weights) / max(total, 1)


def fine_tune(model, loss_fn, optimizer, batches, masks=None, epochs=1):
    """Train ``model`` on ``batches`` (a callable returning an iterable of ``(x, y)`` per epoch,
    or a list) with pruned weights held at zero: their gradients are masked and the masks
    re-applied after every step. Returns the loss of each step."""
    params = dict(model.named_parameters())
    losses = []
    for _ in range(epochs):
        for x, y in (batches() if callable(batches) else batches):
            loss = loss_fn(model(Tensor(np.asarray(x))), Tensor(np.asarray(y)))
            optimizer.zero_grad()
            loss.backward()
            for name, mask in (masks or {}).items():
                if params[name].grad is not None:
                    params[name].grad = params[name].grad * mask.astype(params[name].dtype)
            optimizer.step()
            if masks:
                apply_masks(model, masks)
            losses.append(float(loss.numpy()))
    return losses


# --- structured channel pruning ---------------------------------------------------------------
def channel_norms(layer):
    """L1 norm of each output channel's weights (a conv filter, a linear layer's column)."""
    w = layer.weight.numpy()
    return np.abs(w).reshape(w.shape[0], -1).sum(1) if isinstance(layer, Conv2d) \
        else np.abs(w).sum(0)


def _kept_channels(layer, keep):
    n = layer.out_channels if isinstance(layer, Conv2d) else layer.out_features
    count = round(keep * n) if isinstance(keep, float) else keep
    if not isinstance(count, (int, np.integer)) or not 1 <= count <= n:
        raise ArgumentError(f"prune_channels: keep must leave 1..{n} channels, got {keep!r}")
    return np.sort(np.argsort(-channel_norms(layer), kind="stable")[:count])


def _sliced_conv(conv, out_idx=None, in_idx=None):
    w = conv.weight.numpy()
    w = w if out_idx is None else w[out_idx]
    w = w if in_idx is None else w[:, in_idx]
    if conv.groups != 1:  # slicing channels of a grouped conv would break its groups
        raise ArgumentError(f"prune_channels: grouped convolutions (groups={conv.groups}) are "
                            "not supported")
    new = Conv2d(w.shape[1], w.shape[0], conv.kernel_size, conv.stride, conv.padding,
                 bias=conv.bias is not None, dilation=conv.dilation)
    new.weight = Parameter(np.ascontiguousarray(w))
    if conv.bias is not None:
        b = conv.bias.numpy()
        new.bias = Parameter(b if out_idx is None else b[out_idx])
    return new


def _sliced_linear(lin, out_idx=None, in_idx=None):
    w = lin.weight.numpy()
    w = w if out_idx is None else w[:, out_idx]
    w = w if in_idx is None else w[in_idx]
    new = Linear(w.shape[0], w.shape[1], bias=lin.bias is not None)
    new.weight = Parameter(np.ascontiguousarray(w))
    if lin.bias is not None:
        b = lin.bias.numpy()
        new.bias = Parameter(b if out_idx is None else b[out_idx])
    return new


def _sliced_bn(bn, idx):
    new = BatchNorm2d(len(idx), bn.eps, bn.momentum)
    new.weight, new.bias = Parameter(bn.weight.numpy()[idx]), Parameter(bn.bias.numpy()[idx])
    new.register_buffer("running_mean", bn.running_mean[idx].copy())
    new.register_buffer("running_var", bn.running_var[idx].copy())
    return new


def prune_channels(model, index, keep=0.5):
    """A copy of the ``Sequential`` ``model`` with the weakest output channels of layer
    ``index`` removed, and the inputs of the next Linear/Conv2d that read them.

    Between the two layers may sit element-wise layers (ReLU, Dropout, ...), batch norms (their
    channels are sliced too) and one ``Flatten`` (conv channels become blocks of ``H*W``
    features of the following Linear).

    Args:
        model: an ``nn.Sequential``.
        index: position of the Conv2d or Linear to prune (not the last such layer).
        keep: the fraction (float) or number (int) of channels to keep, by L1 norm.

    Returns:
        The smaller ``Sequential`` (the input model is unchanged; untouched layers are shared).
    """
    if not isinstance(model, Sequential):
        raise DTypeError(f"prune_channels: expects an nn.Sequential, got {type(model).__name__}")
    layers = list(model)
    if not 0 <= index < len(layers) or not isinstance(layers[index], (Conv2d, Linear)):
        raise ArgumentError(f"prune_channels: layer {index} is not a Conv2d or Linear")
    idx = _kept_channels(layers[index], keep)
    first = layers[index]
    out = layers[:index]
    out.append(_sliced_conv(first, out_idx=idx) if isinstance(first, Conv2d)
               else _sliced_linear(first, out_idx=idx))
    channels, spatial = first.out_channels if isinstance(first, Conv2d) else None, None
    for j in range(index + 1, len(layers)):
        layer = layers[j]
        if isinstance(layer, BatchNorm2d):
            out.append(_sliced_bn(layer, idx))
        elif isinstance(layer, Flatten):
            spatial = "pending"
            out.append(layer)
        elif isinstance(layer, Conv2d):
            out.append(_sliced_conv(layer, in_idx=idx))
            return Sequential(*out, *layers[j + 1:])
        elif isinstance(layer, Linear):
            if spatial == "pending":
                area = layer.in_features // channels
                rows = (idx[:, None] * area + np.arange(area)[None, :]).ravel()
            else:
                rows = idx
            out.append(_sliced_linear(layer, in_idx=rows))
            return Sequential(*out, *layers[j + 1:])
        else:
            out.append(layer)
    raise ArgumentError(f"prune_channels: no Conv2d or Linear after layer {index} reads its "
                        f"channels")


# --- CSR sparse matrices ------------------------------------------------------------------------
@dataclass
class CSRMatrix:
    """A matrix in compressed sparse row form: row ``i``'s nonzeros are
    ``data[indptr[i]:indptr[i+1]]`` in the columns ``indices[indptr[i]:indptr[i+1]]``."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple

    @classmethod
    def from_dense(cls, a):
        """The CSR form of the 2-D array ``a`` (exact zeros are left out)."""
        a = np.asarray(a)
        if a.ndim != 2:
            raise ShapeError(f"CSRMatrix.from_dense: expects a matrix, got shape {a.shape}")
        rows, cols = np.nonzero(a)
        indptr = np.zeros(a.shape[0] + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])
        return cls(a[rows, cols], cols.astype(np.int32), indptr, a.shape)

    def to_dense(self):
        out = np.zeros(self.shape, self.data.dtype)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out[rows, self.indices] = self.data
        return out

    @property
    def nnz(self):
        return int(self.data.size)

    @property
    def density(self):
        return self.nnz / max(self.shape[0] * self.shape[1], 1)

    @property
    def nbytes(self):
        """Storage: values, column indices and row pointers."""
        return int(self.data.nbytes + self.indices.nbytes + self.indptr.nbytes)


@numba.njit(parallel=True, fastmath=True, cache=CACHE)
def _csr_matmul_kernel(data, indices, indptr, b, out):
    n = b.shape[1]
    for i in prange(out.shape[0]):
        for j in range(n):
            out[i, j] = 0
        for p in range(indptr[i], indptr[i + 1]):
            k, v = indices[p], data[p]
            for j in range(n):  # row i of the result += v * row k of b: unit stride
                out[i, j] += v * b[k, j]


def csr_matmul(a, b):
    """``a @ b`` for a :class:`CSRMatrix` ``a`` (M, K) and a dense ``b`` (K, N): for every
    nonzero ``a[i, k]``, row ``k`` of ``b`` scaled into row ``i`` of the result — work
    proportional to ``nnz · N`` instead of ``M · K · N``, but with an index load per nonzero
    and no reuse of ``b`` across rows, which is why it needs low density to win."""
    if not isinstance(a, CSRMatrix):
        raise DTypeError(f"csr_matmul: a must be a CSRMatrix, got {type(a).__name__}")
    b = np.ascontiguousarray(b)
    if b.ndim != 2 or b.shape[0] != a.shape[1]:
        raise ShapeError(f"csr_matmul: a {a.shape} @ b {b.shape} do not agree")
    if b.dtype != a.data.dtype or b.dtype.kind != "f":
        raise DTypeError(f"csr_matmul: a and b must share one float dtype, got {a.data.dtype} "
                         f"and {b.dtype}")
    out = np.empty((a.shape[0], b.shape[1]), b.dtype)
    _csr_matmul_kernel(a.data, a.indices, a.indptr, b, out)
    return out


def random_sparse(shape, density, rng=0, dtype=np.float32):
    """A dense matrix with ``density`` of its entries nonzero (standard normal), the rest 0."""
    rng = np.random.default_rng(rng)
    a = rng.standard_normal(shape).astype(dtype)
    a[rng.random(shape) >= density] = 0
    return a


__all__ = ["prunable", "magnitude_masks", "apply_masks", "sparsity_of", "fine_tune",
           "channel_norms", "prune_channels", "CSRMatrix", "csr_matmul", "random_sparse"]
