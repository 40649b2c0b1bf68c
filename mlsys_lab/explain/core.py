"""What every explainer shares: the :class:`Explanation` it returns, and the counted model.

An explainer sees a model only through :class:`CountedModel`, which runs it on batches, picks
the target output and counts the cost: ``forward`` (inputs run through the model) and
``backward`` (inputs differentiated). The counts are what the chapter compares methods by.
"""

from dataclasses import dataclass, field

import numpy as np

from ..engine.autodiff import value_and_grad
from ..engine.tensor import Tensor, no_grad
from ..errors import ArgumentError, ShapeError


@dataclass
class Explanation:
    """An attribution and what it cost.

    Attributes:
        attributions: one number per input feature (the input's shape), or per activation
            position for Grad-CAM (the layer's spatial shape).
        method: the explainer's name.
        forward: inputs run through the model (a batch of n counts n).
        backward: inputs differentiated (each also counted in ``forward``).
        info: method-specific numbers (IG's completeness error, KernelSHAP's coalitions, ...).
    """

    attributions: np.ndarray
    method: str
    forward: int
    backward: int = 0
    info: dict = field(default_factory=dict)

    @property
    def evaluations(self) -> int:
        """Model evaluations: forward passes plus backward passes."""
        return self.forward + self.backward

    def __repr__(self):
        extra = "".join(f", {k}={v:.3g}" if isinstance(v, float) else f", {k}={v}"
                        for k, v in self.info.items() if np.isscalar(v))
        return (f"Explanation({self.method}, shape={tuple(self.attributions.shape)}, "
                f"forward={self.forward}, backward={self.backward}{extra})")


def _as_array(x, fn):
    if isinstance(x, Tensor):
        x = x.numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        raise ArgumentError(f"{fn}: input must be numeric, got dtype {arr.dtype}")
    return arr


class CountedModel:
    """``model`` seen as a function of one input, with its cost counted.

    Args:
        model: an ``nn`` Module (or any callable from a batch Tensor to a batch Tensor).
        target: the output column explained (a class index); ``None`` for a model whose output
            is one number per row.
        fn: the explainer's name, for error messages.
    """

    def __init__(self, model, target=None, fn="explain"):
        if not callable(model):
            raise ArgumentError(f"{fn}: model must be callable, got {type(model).__name__}")
        if target is not None and (isinstance(target, bool)
                                   or not isinstance(target, (int, np.integer))):
            raise ArgumentError(f"{fn}: target must be an int class index or None, "
                                f"got {target!r}")
        self.model, self.target, self.fn = model, target, fn
        self.forward = self.backward = 0

    def _pick(self, out):
        if self.target is None:
            if out.ndim == 2 and out.shape[1] == 1:
                return out[:, 0]
            if out.ndim != 1:
                raise ShapeError(f"{self.fn}: the model's output has shape {tuple(out.shape)}; "
                                 f"give target= the class to explain")
            return out
        if out.ndim != 2 or not 0 <= self.target < out.shape[1]:
            raise ShapeError(f"{self.fn}: target {self.target} is not a column of the model's "
                             f"output of shape {tuple(out.shape)}")
        return out[:, int(self.target)]

    def outputs(self, batch) -> np.ndarray:
        """The model's whole output on a batch, counted (no gradient)."""
        batch = _as_array(batch, self.fn)
        self.forward += len(batch)
        with no_grad():
            out = self.model(batch)
        return np.asarray(out.numpy() if isinstance(out, Tensor) else out)

    def values(self, batch) -> np.ndarray:
        """The target output for each row of ``batch``: shape (n,)."""
        return self._pick(self.outputs(batch))

    def gradients(self, batch):
        """(values (n,), d value_i / d row_i with the batch's shape), counted.

        The rows are independent (the model is in eval mode), so the gradient of the sum of the
        targets is each row's own gradient.
        """
        batch = _as_array(batch, self.fn)
        if batch.dtype.kind != "f":
            batch = batch.astype(np.float64)
        self.forward += len(batch)
        self.backward += len(batch)

        values_holder = []

        def scored(x):
            out = self.model(x)
            picked = self._pick(out)
            values_holder.append(picked)
            return picked.sum()

        _, g = value_and_grad(scored)(batch)
        return np.asarray(values_holder[0].numpy()), np.asarray(g.numpy())

    def explanation(self, attributions, method, **info) -> Explanation:
        """An :class:`Explanation` carrying this model's counts."""
        return Explanation(np.asarray(attributions), method, self.forward, self.backward, info)


def check_input(fn, x, model_input_ndim=None):
    """``x`` as a float array (one input, no batch axis)."""
    arr = _as_array(x, fn)
    if arr.ndim == 0:
        raise ShapeError(f"{fn}: x must be one input without a batch axis, got a scalar")
    if model_input_ndim is not None and arr.ndim != model_input_ndim:
        raise ShapeError(f"{fn}: x must have {model_input_ndim} dimensions, got shape "
                         f"{arr.shape}")
    return arr.astype(np.float64) if arr.dtype.kind != "f" else arr


def check_baseline(fn, x, baseline):
    """The baseline broadcast to ``x``'s shape (``None`` or a number -> that constant)."""
    if baseline is None:
        return np.zeros_like(x)
    b = _as_array(baseline, fn).astype(x.dtype)
    try:
        return np.broadcast_to(b, x.shape).copy()
    except ValueError:
        raise ShapeError(f"{fn}: baseline of shape {b.shape} does not broadcast to the "
                         f"input's shape {x.shape}") from None


def check_count(fn, name, n, minimum=1):
    """A positive int argument (a step count, a sample count)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ArgumentError(f"{fn}: {name} must be an int >= {minimum}, got {n!r}")
    return int(n)
