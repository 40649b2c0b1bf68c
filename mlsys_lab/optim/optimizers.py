"""Optimisers update parameters in place from their ``.grad`` (numpy arithmetic, no tape).

A ``.grad`` may be a :class:`~mlsys_lab.engine.sparse.RowSparse` (an embedding table looked up
with ``sparse=True``) or a dense array (``sparse=False``, and every other parameter): the
gradient's type alone picks the update. Given a RowSparse, SGD, Adagrad and SparseAdam touch
only its rows (``sparse_update``), every other row and its state stay as they are; given a
dense gradient, the whole table is updated. The others refuse a RowSparse (an
``ArgumentError`` naming the optimiser and the ``sparse=True`` lookup), as PyTorch's do, rather
than densify it; so do SGD with momentum or weight decay and Adagrad with weight decay, which
would change every row, and SparseAdam refuses a dense gradient. The sparse updates merge
duplicate rows (``RowSparse.merged``) and run one fused Numba read-modify-write over the
touched rows (:mod:`mlsys_lab.kernels.embedding`), with the dense update's float operations,
so a touched row ends as the dense optimiser would leave it.
"""

import math
import numbers

import numpy as np

from ..engine.sparse import RowSparse
from ..engine.tensor import Tensor
from ..errors import ArgumentError, CheckpointError, DTypeError
from ..kernels import embedding as _rows
from ..kernels.optim import adagrad_dense, adam_dense, rmsprop_dense, sgd_dense

#: PyTorch's wording for each hyper-parameter it checks, and whether it must also be below 1.
_LIMITS = {"lr": ("learning rate", False), "momentum": ("momentum value", False),
           "weight_decay": ("weight_decay value", False), "eps": ("epsilon value", False),
           "alpha": ("alpha value", False), "beta1": ("beta parameter at index 0", True),
           "beta2": ("beta parameter at index 1", True), "lr_decay": ("lr_decay", False),
           "initial_accumulator_value": ("initial_accumulator_value", False)}


def _check_hyper(owner, hyper):
    """Refuse hyper-parameters PyTorch refuses: each numeric one must be a finite real >= 0
    (betas in [0, 1)); ``nesterov`` needs a positive momentum. NaN and inf are refused too
    (PyTorch accepts a NaN learning rate, which only turns every parameter into NaN)."""
    for name, value in hyper.items():
        if name == "nesterov":
            if not isinstance(value, (bool, np.bool_)):
                raise DTypeError(f"{owner}: nesterov must be True or False, got {value!r}")
            if value and not hyper.get("momentum"):
                raise ArgumentError(f"{owner}: Nesterov momentum requires a momentum "
                                     f"(momentum > 0), got momentum={hyper.get('momentum')!r}")
            continue
        if name not in _LIMITS:  # a subclass's own hyper-parameter: its own business
            continue
        what, below_one = _LIMITS[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise DTypeError(f"{owner}: {name} must be a real number, got {value!r} "
                             f"({type(value).__name__})")
        if not (math.isfinite(value) and value >= 0 and (value < 1 or not below_one)):
            rule = "in [0, 1)" if below_one else "a finite number >= 0"
            raise ArgumentError(f"{owner}: Invalid {what}: {value!r} ({name} must be {rule})")


def _as_python_numbers(hyper):
    """The checked hyper-parameters as Python floats (a NumPy scalar would make numpy compute
    a float32 parameter's update in float64 where a Python number does not, and the fused
    updates of :mod:`mlsys_lab.kernels.optim` follow the Python-number rules)."""
    return {k: float(v) if k in _LIMITS else v for k, v in hyper.items()}


class Optimizer:
    """Base class: holds parameters, hyper-parameters and per-parameter state arrays.

    Raises:
        DTypeError: ``params`` is a single Tensor or holds something that is not a Tensor, or
            a hyper-parameter is not a real number.
        ArgumentError: ``params`` is empty or a hyper-parameter is out of range (a negative
            or NaN learning rate, a beta outside [0, 1), ...), with PyTorch's wording.
    """

    hyper_names = ("lr",)
    state_names = ()

    def __init__(self, params, **hyper):
        owner = type(self).__name__
        if isinstance(params, Tensor):
            raise DTypeError(f"{owner}: params must be an iterable of Tensors such as "
                             f"model.parameters(), got a single {type(params).__name__}")
        try:
            self.params = list(params)
        except TypeError:
            raise DTypeError(f"{owner}: params must be an iterable of Tensors such as "
                             f"model.parameters(), got {type(params).__name__}") from None
        if not self.params:
            raise ArgumentError(f"{owner}: got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor):
                raise DTypeError(f"{owner}: can only optimize Tensors (Parameters), but "
                                 f"params[{i}] is a {type(p).__module__}.{type(p).__qualname__}")
        _check_hyper(owner, hyper)
        self.hyper = _as_python_numbers(hyper)
        self.step_count = 0
        self.state = [{n: np.zeros_like(p.data) for n in self.state_names} for p in self.params]

    def zero_grad(self):
        """Clear every parameter's ``.grad``."""
        for p in self.params:
            p.grad = None

    def step(self):
        """Apply one update to every parameter that has a gradient."""
        self.step_count += 1
        for p, st in zip(self.params, self.state):
            if isinstance(p.grad, RowSparse):
                if tuple(p.grad.shape) != tuple(p.shape):
                    raise ArgumentError(f"{type(self).__name__}: a row-sparse gradient of shape "
                                        f"{p.grad.shape} for a parameter of shape {p.shape}")
                self.sparse_update(p, p.grad.astype(p.data.dtype), st)
            elif p.grad is not None:
                g = p.grad.data if hasattr(p.grad, "data") else np.asarray(p.grad)
                self.update(p, g.astype(p.data.dtype, copy=False), st)

    def update(self, p, g, state):
        """Update parameter ``p`` in place from gradient array ``g`` and its ``state``."""
        raise NotImplementedError

    def sparse_update(self, p, g, state):
        """Update only rows ``g.indices`` of ``p`` from a RowSparse ``g`` (duplicate indices
        possible: an update that is not linear in ``g`` must ``g.coalesce()`` first)."""
        raise ArgumentError(f"{type(self).__name__} does not support sparse gradients (the "
                            f"{p.shape} parameter has a RowSparse .grad, from an embedding "
                            f"lookup with sparse=True); use SGD, Adagrad or SparseAdam for it, "
                            f"or look the table up with sparse=False for a dense gradient")

    def _no_sparse(self, *names):
        """Refuse hyper-parameters that would touch every row of a sparse parameter."""
        for n in names:
            if self.hyper[n]:
                raise ArgumentError(f"{type(self).__name__}: {n}={self.hyper[n]!r} is not "
                                    f"compatible with sparse gradients (it changes every row; "
                                    f"the RowSparse .grad comes from an embedding lookup with "
                                    f"sparse=True, sparse=False gives a dense one)")

    def state_dict(self):
        """Hyper-parameters, step count and per-parameter state arrays (for ``ml.save``)."""
        return {"hyper": {k: float(v) if not isinstance(v, bool) else v
                          for k, v in self.hyper.items()},
                "step": self.step_count,
                "state": {str(i): dict(st) for i, st in enumerate(self.state)}}

    def load_state_dict(self, sd):
        """Restore hyper-parameters and state; validated fully before anything changes."""
        try:
            state = [sd["state"][str(i)] for i in range(len(self.params))]
            hyper, step = dict(sd["hyper"]), int(sd["step"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: missing or malformed "
                                  f"{e}") from None
        unknown = sorted(set(hyper) - set(self.hyper))
        if unknown:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: unknown "
                                  f"hyper-parameters {unknown} (known: {sorted(self.hyper)})")
        try:
            _check_hyper(f"{type(self).__name__}.load_state_dict", {**self.hyper, **hyper})
        except (DTypeError, ArgumentError) as e:
            raise CheckpointError(str(e)) from None
        for i, (p, st) in enumerate(zip(self.params, state)):
            for n in self.state_names:
                if n not in st or np.shape(st[n]) != p.shape:
                    raise CheckpointError(f"{type(self).__name__}.load_state_dict: state {i}.{n} "
                                          f"missing or not of shape {p.shape}")
        self.hyper.update(_as_python_numbers(hyper))
        self.step_count = step
        self.state = [{n: np.array(st[n], dtype=p.data.dtype) for n in self.state_names}
                      for p, st in zip(self.params, state)]


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov and weight decay."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         nesterov=nesterov)

    def update(self, p, g, st):
        h = self.hyper
        if h["weight_decay"]:
            g = g + h["weight_decay"] * p.data
        if h["momentum"]:
            buf = st["momentum_buffer"]
            buf *= h["momentum"]
            buf += g
            g = g + h["momentum"] * buf if h["nesterov"] else buf
        sgd_dense(p.data, g, h["lr"])  # p -= lr * g in one pass, without an lr * g temporary

    def sparse_update(self, p, g, st):
        """Plain SGD on the touched rows (momentum and weight decay would touch every row);
        duplicates are summed first, as the dense gradient sums them."""
        self._no_sparse("momentum", "weight_decay")
        _rows.sgd_rows(p.data, g.merged(), self.hyper["lr"])


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` adds L2 to the gradient."""

    state_names = ("m", "v")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise DTypeError(f"Adam: betas must be a pair (beta1, beta2), got {betas!r}")
        super().__init__(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps,
                         weight_decay=weight_decay)

    def update(self, p, g, st):
        # one fused in-place pass, bit-identical to the numpy formula (adam_dense_reference)
        h = self.hyper
        adam_dense(p.data, g, st["m"], st["v"], h["lr"], h["beta1"], h["beta2"], h["eps"],
                   h["weight_decay"], self.step_count)


class RMSProp(Optimizer):
    """RMSProp: divide the gradient by a running RMS of recent gradients."""

    state_names = ("square_avg",)

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay)

    def update(self, p, g, st):
        # one fused in-place pass, bit-identical to the numpy formula (rmsprop_dense_reference)
        h = self.hyper
        rmsprop_dense(p.data, g, st["square_avg"], h["lr"], h["alpha"], h["eps"],
                      h["weight_decay"])


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.), as ``torch.optim.Adagrad``: ``sum += g^2``,
    ``p -= lr_t * g / (sqrt(sum) + eps)`` with ``lr_t = lr / (1 + (t - 1) lr_decay)``.

    A row-sparse gradient updates the accumulator and the parameter in its rows only, which
    gives exactly the dense result (an untouched row has ``g = 0``: neither changes).
    """

    state_names = ("sum",)

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10):
        super().__init__(params, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                         initial_accumulator_value=initial_accumulator_value, eps=eps)
        for st in self.state:
            st["sum"] += np.asarray(initial_accumulator_value, st["sum"].dtype)

    def _lr(self):
        h = self.hyper
        return h["lr"] / (1 + (self.step_count - 1) * h["lr_decay"])

    def update(self, p, g, st):
        # one fused in-place pass, bit-identical to the numpy formula (adagrad_dense_reference)
        adagrad_dense(p.data, g, st["sum"], self._lr(), self.hyper["eps"],
                      self.hyper["weight_decay"])

    def sparse_update(self, p, g, st):
        self._no_sparse("weight_decay")
        _rows.adagrad_rows(p.data, st["sum"], g.merged(), self._lr(), self.hyper["eps"])


class SparseAdam(Optimizer):
    """Lazy Adam for row-sparse gradients, as ``torch.optim.SparseAdam``: only the rows a
    gradient touches have their moments ``m, v`` updated and are moved; every other row keeps
    its moments as they were (no decay), which is what makes it differ from dense Adam. Each
    parameter counts its own steps (those in which it had a gradient) for the bias correction.

    Raises:
        ArgumentError: at ``step()``, a parameter has a dense gradient (use Adam for it).
    """

    state_names = ("m", "v")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise DTypeError(f"SparseAdam: betas must be a pair (beta1, beta2), got {betas!r}")
        super().__init__(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps)
        self.param_steps = [0] * len(self.params)

    def update(self, p, g, st):
        raise ArgumentError(f"SparseAdam does not support dense gradients (parameter of shape "
                            f"{p.shape}); use Adam for it, or look the table up with "
                            f"sparse=True for a row-sparse gradient")

    def sparse_update(self, p, g, st):
        h = self.hyper
        i = next(k for k, q in enumerate(self.params) if q is p)
        self.param_steps[i] += 1
        _rows.sparse_adam_rows(p.data, st["m"], st["v"], g.merged(), h["lr"],
                               (h["beta1"], h["beta2"]), h["eps"], self.param_steps[i])

    def state_dict(self):
        sd = super().state_dict()
        sd["param_steps"] = np.asarray(self.param_steps, np.int64)
        return sd

    def load_state_dict(self, sd):
        steps = np.asarray(sd.get("param_steps", np.zeros(len(self.params))), np.int64)
        if steps.shape != (len(self.params),):
            raise CheckpointError(f"SparseAdam.load_state_dict: param_steps must have "
                                  f"{len(self.params)} entries, got shape {steps.shape}")
        super().load_state_dict(sd)
        self.param_steps = [int(s) for s in steps]
