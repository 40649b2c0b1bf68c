"""Module: the object-oriented way to hold parameters (like ``torch.nn.Module``)."""

from collections import OrderedDict

import numpy as np

from ..engine.tensor import Tensor
from ..errors import CheckpointError


def _join(prefix, name):
    """Dotted name of ``name`` inside the module called ``prefix`` ('' for the root)."""
    return f"{prefix}.{name}" if prefix else name


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable (requires_grad by default)."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True, name=None):
        arr = data.numpy() if isinstance(data, Tensor) else np.asarray(data)
        if arr.dtype.kind != "f":
            arr = arr.astype(np.float32)
        super().__init__(arr, requires_grad=requires_grad, name=name)

    def __repr__(self):
        return f"Parameter({self.dtype.name}{list(self.shape)})"


class Module:
    """Base class of layers and models. Subclasses assign Parameters, buffers (via
    :meth:`register_buffer`) and sub-Modules as attributes and define :meth:`forward`."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 f"before assigning {name!r}")
        # A replacement of the same kind keeps its slot (a Sequential's order is its
        # children's order); anything else leaves the old registry first.
        for d in (self._parameters, self._buffers, self._modules):
            keep = ((d is self._parameters and isinstance(value, Parameter))
                    or (d is self._modules and isinstance(value, Module)))
            if not keep:
                d.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, array):
        """A non-trainable state array saved in the state_dict (e.g. running statistics)."""
        self._buffers[name] = np.asarray(array)
        object.__setattr__(self, name, self._buffers[name])

    def _set_buffer(self, name, array):
        self._buffers[name] = array
        object.__setattr__(self, name, array)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # --- traversal -------------------------------------------------------------------------------
    def named_children(self):
        return iter(self._modules.items())

    def children(self):
        return iter(self._modules.values())

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(_join(prefix, name))

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix=""):
        """(dotted name, Parameter) for this module and its children, each parameter once."""
        seen = set()
        for mname, m in self.named_modules(prefix):
            for pname, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield _join(mname, pname), p

    def parameters(self):
        """The Parameters of this module and its children, as a list."""
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        """(dotted name, owning module, attribute name, array) for every buffer."""
        for mname, m in self.named_modules():
            for bname, b in m._buffers.items():
                yield _join(mname, bname), m, bname, b

    def num_parameters(self):
        """Total number of parameter elements."""
        return int(sum(p.size for p in self.parameters()))

    # --- modes -----------------------------------------------------------------------------------
    def train(self, mode=True):
        """Set training mode (``mode=True``) or evaluation mode on every submodule."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def zero_grad(self):
        """Clear every parameter's ``.grad``."""
        for p in self.parameters():
            p.grad = None

    # --- state -----------------------------------------------------------------------------------
    def state_dict(self):
        """An ordered dict of name -> numpy array (copies) of every parameter and buffer."""
        out = OrderedDict()
        for name, p in self.named_parameters():
            out[name] = p.data.copy()
        for name, _, _, b in self.named_buffers():
            out[name] = np.array(b, copy=True)
        return out

    def load_state_dict(self, state, strict=True):
        """Load arrays by name. Everything is checked before anything changes, so a bad
        state_dict leaves the module untouched.

        Args:
            state: dict of name -> array (e.g. from ``ml.load``).
            strict: require exactly the module's keys. With ``strict=False`` missing and extra
                keys are allowed (partial loading, e.g. a warm start of only some layers).

        Returns:
            ``(missing_keys, unexpected_keys)``.
        """
        params = dict(self.named_parameters())
        bufs = {name: (m, bname, b) for name, m, bname, b in self.named_buffers()}
        own = list(params) + list(bufs)
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in params and k not in bufs]
        if strict and (missing or unexpected):
            raise CheckpointError(f"load_state_dict: {type(self).__name__} state mismatch; "
                                  f"missing keys {missing}, unexpected keys {unexpected}")
        staged = []
        for k in own:
            if k not in state:
                continue
            arr = np.asarray(state[k])
            target = params[k].data if k in params else np.asarray(bufs[k][2])
            if arr.shape != target.shape:
                raise CheckpointError(f"load_state_dict: {k} has shape {arr.shape} in the "
                                      f"checkpoint but {target.shape} in the model")
            if arr.dtype.kind != target.dtype.kind and not (
                    arr.dtype.kind in "iu" and target.dtype.kind in "iu"):
                raise CheckpointError(f"load_state_dict: {k} has dtype {arr.dtype} in the "
                                      f"checkpoint but {target.dtype} in the model")
            staged.append((k, arr.astype(target.dtype, copy=True)))
        for k, arr in staged:
            if k in params:
                params[k].data = arr
            else:
                m, bname, _ = bufs[k]
                m._set_buffer(bname, arr)
        return missing, unexpected

    # --- printing --------------------------------------------------------------------------------
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


def functional_call(module, params, *args, **kwargs):
    """Call ``module`` with its parameters replaced by ``params`` (dotted name -> Tensor), as a
    pure function of them (like ``torch.func.functional_call``); the module is restored after."""
    owners = {}
    for mname, m in module.named_modules():
        for pname in m._parameters:
            owners[_join(mname, pname)] = (m, pname)
    unknown = set(params) - set(owners)
    if unknown:
        raise KeyError(f"functional_call: {type(module).__name__} has no parameters "
                       f"{sorted(unknown)}")
    saved = []
    try:
        for name, value in params.items():
            m, pname = owners[name]
            saved.append((m, pname, m._parameters[pname]))
            object.__setattr__(m, pname, value)
        return module(*args, **kwargs)
    finally:
        for m, pname, p in saved:
            object.__setattr__(m, pname, p)
