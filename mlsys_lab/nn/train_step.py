"""One training step — forward, backward and the SGD update — traced and compiled as one graph.

The engine compiles any function; this module builds the training-step function of an
``ml.nn`` model for it (``ml.compile_train_step``), so the engine never imports ``nn``.
"""

import numpy as np

from ..engine.autodiff import value_and_grad
from ..engine.compiler import Compiled
from ..engine.trace import trace
from .module import functional_call


def sgd_step_fn(model, loss_fn, lr):
    """A pure function ``step(params, x, y) -> (loss, new_params)``: forward, backward and the
    SGD update of ``model`` under ``loss_fn(output, y)``, ready to be traced into one graph."""
    names = [n for n, _ in model.named_parameters()]

    def step(params, x, y):
        def loss_of(p):
            return loss_fn(functional_call(model, p, x), y)

        loss, grads = value_and_grad(loss_of)(params)
        return loss, {k: params[k] - lr * grads[k] for k in names}

    return step


def trace_train_step(model, loss_fn, example_x, example_y, lr=0.01):
    """The training-step Graph (forward + backward + SGD update) of ``model``."""
    arrays = {k: p.data for k, p in model.named_parameters()}
    return trace(sgd_step_fn(model, loss_fn, lr), arrays, example_x, example_y,
                 name="train_step")


class CompiledTrainStep:
    """One training step — forward, backward and the SGD update — compiled into ONE graph.

    ``step(x, y)`` runs it and writes the new parameters straight back into the model's
    Parameters; returns the loss. ``compiled`` is the underlying :class:`Compiled`.
    """

    def __init__(self, model, loss_fn, example_x, example_y, lr=0.01, **options):
        self.model, self.lr = model, lr
        self.params = dict(model.named_parameters())
        arrays = {k: p.data for k, p in self.params.items()}
        n = len(arrays)  # inputs: params (sorted names), x, y; outputs: loss, params (sorted)
        options.setdefault("donate", [(i, i + 1) for i in range(n)])
        self.compiled = Compiled(sgd_step_fn(model, loss_fn, lr), arrays, example_x, example_y,
                                 name="train_step", **options)
        self._loss = np.zeros((), self.compiled.graph.outputs[0].dtype)
        self._names = sorted(self.params)  # the order a dict flattens in

    def __call__(self, x, y, profile=False):
        params = [self.params[k].data for k in self._names]
        x, y = np.asarray(getattr(x, "data", x)), np.asarray(getattr(y, "data", y))
        self.compiled.call_flat(params + [x, y], [self._loss, *params], profile=profile)
        return float(self._loss)


def compile_train_step(model, loss_fn, example_x, example_y, lr=0.01, **options):
    """Compile SGD training of ``model`` under ``loss_fn(output, y)``; see CompiledTrainStep."""
    return CompiledTrainStep(model, loss_fn, example_x, example_y, lr, **options)
