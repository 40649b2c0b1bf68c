"""The agents' networks (small MLPs) and one gradient step of an arbitrary loss over them."""

import numpy as np

from ...engine.autodiff import value_and_grad
from ...engine.compiler import Compiled
from ...engine.tensor import Tensor, as_tensor, no_grad
from ...errors import ArgumentError
from ...nn import Linear, ReLU, Sequential, Tanh, functional_call
from ...optim import Adam

ACTIVATIONS = {"tanh": Tanh, "relu": ReLU}


def orthogonal(shape, gain, rng):
    """An orthogonal (in, out) matrix times ``gain`` (Saxe et al.; what CleanRL initialises
    its PPO layers with)."""
    a = rng.standard_normal((max(shape), min(shape)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    q = q if shape[0] >= shape[1] else q.T
    return (gain * q[:shape[0], :shape[1]]).astype(np.float32)


def mlp(sizes, activation="tanh", rng=None, out_gain=1.0, hidden_gain=2.0 ** 0.5):
    """``Linear -> activation -> ... -> Linear`` over ``sizes`` (input, hidden..., output),
    weights orthogonal (hidden layers scaled by ``hidden_gain``, the last by ``out_gain``),
    biases zero.

    Raises:
        ArgumentError: unknown ``activation`` or fewer than two sizes.
    """
    if activation not in ACTIVATIONS:
        raise ArgumentError(f"mlp: activation={activation!r}; known: {sorted(ACTIVATIONS)}")
    if len(sizes) < 2:
        raise ArgumentError(f"mlp: need at least (input, output) sizes, got {sizes!r}")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        lin = Linear(int(n_in), int(n_out), rng=rng)
        last = i == len(sizes) - 2
        lin.weight.data[...] = orthogonal((n_in, n_out), out_gain if last else hidden_gain, rng)
        layers.append(lin)
        if not last:
            layers.append(ACTIVATIONS[activation]())
    return Sequential(*layers)


def forward(model, x):
    """``model(x)`` as a numpy array, without recording a tape (acting, targets)."""
    with no_grad():
        out = model(np.asarray(x, np.float32))
    return out.data if isinstance(out, Tensor) else np.asarray(out)


class GradStep:
    """One optimiser step of ``loss_fn(params, *batch)`` over ``model``'s parameters.

    ``loss_fn`` receives the parameters as a dict (dotted name -> Tensor) and must call the
    model through :func:`~mlsys_lab.nn.functional_call`, so that the whole step is a pure
    function the engine can trace. With ``compiled=True`` the loss and its gradient are traced
    once for the batch's shapes and run as one compiled graph (``ml.compile`` of
    ``value_and_grad``); the Adam update (and the optional global-norm clipping) runs on the
    returned arrays. ``compiled=False`` runs the same function on the eager tape.

    Args:
        model: the ``nn.Module`` whose parameters are trained.
        loss_fn: ``loss_fn(params, *batch) -> scalar Tensor``.
        example_batch: arrays shaped like every later batch (the compiled graph's shapes).
        lr: Adam's learning rate (change it later through ``self.optimizer.hyper["lr"]``).
        max_grad_norm: clip the gradients' global L2 norm to this (None: no clipping).
        compiled: compile the step (see above).
        eps: Adam's epsilon.
    """

    def __init__(self, model, loss_fn, example_batch, lr=1e-3, max_grad_norm=None,
                 compiled=True, eps=1e-8):
        self.model, self.loss_fn = model, loss_fn
        self.params = dict(model.named_parameters())
        self.optimizer = Adam(self.params.values(), lr=lr, eps=eps)
        self.max_grad_norm = max_grad_norm
        self.compiled = None
        vg = value_and_grad(loss_fn, argnums=0)
        self._eager = vg
        if compiled:
            arrays = {k: p.data for k, p in self.params.items()}
            self.compiled = Compiled(vg, arrays, *[np.asarray(b) for b in example_batch],
                                     name="rl_loss_and_grad")
        self.steps = 0

    def __call__(self, *batch):
        """Run one step on ``batch``; returns the loss (a float)."""
        if self.compiled is not None:
            arrays = {k: p.data for k, p in self.params.items()}
            loss, grads = self.compiled(arrays, *batch, profile=False)
        else:
            loss, grads = self._eager(self.params, *batch)
        grads = {k: np.asarray(getattr(g, "data", g), np.float32) for k, g in grads.items()}
        if self.max_grad_norm is not None:
            norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                               for g in grads.values()))
            if norm > self.max_grad_norm:
                scale = np.float32(self.max_grad_norm / (norm + 1e-6))
                grads = {k: g * scale for k, g in grads.items()}
        for k, p in self.params.items():
            p.grad = as_tensor(grads[k])
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1
        return float(np.asarray(getattr(loss, "data", loss)))


def call(model, params, x):
    """``model`` applied to ``x`` with ``params`` (for loss functions)."""
    return functional_call(model, params, x)
