"""Standard layers built from ml.ops."""

import numpy as np

from .. import ops
from ..engine.ops_nn import check_dropout_p
from ..engine.tensor import Tensor, as_tensor
from ..errors import ShapeError
from . import init
from .module import Module, Parameter


def check_sizes(layer, positive=False, **sizes):
    """Refuse a layer size that is not a non-negative (or, with ``positive``, positive) int."""
    for name, n in sizes.items():
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) \
                or n < int(positive):
            want = "a positive" if positive else "a non-negative"
            raise ShapeError(f"{layer}: {name} must be {want} integer, got {n!r}")


def _input(x, layer):
    """``x`` as a Tensor (arrays and nested lists are lifted; errors name ``layer``)."""
    return x if isinstance(x, Tensor) else as_tensor(x, op=layer)


class Linear(Module):
    """``y = x @ W + b`` with W of shape (in_features, out_features)."""

    def __init__(self, in_features, out_features, bias=True, rng=None):
        super().__init__()
        check_sizes("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init.kaiming_uniform((in_features, out_features), rng,
                                                     gain=1.0))
        self.bias = Parameter(init.zeros((out_features,))) if bias else None

    def forward(self, x):
        x = _input(x, "Linear")
        if x.ndim == 0:
            raise ShapeError(f"Linear({self.in_features}, {self.out_features}): input must have "
                             f"at least 1 dimension (the features), got a 0-d tensor")
        if x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear({self.in_features}, {self.out_features}): input has "
                             f"{x.shape[-1]} features, shape {tuple(x.shape)}")
        y = ops.matmul(x, self.weight)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution over NCHW input with an OIHW weight, as ``torch.nn.Conv2d``.

    ``dilation`` spaces the kernel's taps (a 3x3 kernel with dilation 2 spans 5x5 pixels);
    ``groups`` splits the channels into that many independent convolutions, the weight then
    being (out_channels, in_channels / groups, kH, kW) — ``groups=in_channels`` is a depthwise
    convolution. Both go straight to ``ml.ops.conv2d``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True,
                 rng=None, dilation=1, groups=1):
        super().__init__()
        k = (kernel_size, kernel_size) if np.isscalar(kernel_size) else tuple(kernel_size)
        check_sizes("Conv2d", in_channels=in_channels, out_channels=out_channels)
        if len(k) != 2:
            raise ShapeError(f"Conv2d: kernel_size must be an int or a pair, got {kernel_size!r}")
        check_sizes("Conv2d", positive=True, kernel_height=k[0], kernel_width=k[1],
                     groups=groups)
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv2d: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must both be divisible by groups ({groups})")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.stride, self.padding = stride, padding
        self.dilation, self.groups = dilation, groups
        fan_in_shape = (out_channels, in_channels // groups) + k
        self.weight = Parameter(init.kaiming_uniform(fan_in_shape, rng, gain=1.0))
        self.bias = Parameter(init.zeros((out_channels,))) if bias else None

    def forward(self, x):
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding,
                          dilation=self.dilation, groups=self.groups)

    def extra_repr(self):
        extra = "" if self.dilation == 1 else f", dilation={self.dilation}"
        extra += "" if self.groups == 1 else f", groups={self.groups}"
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}{extra}")


class BatchNorm2d(Module):
    """Batch normalisation over the channel axis of NCHW input, with running statistics."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        check_sizes("BatchNorm2d", num_features=num_features)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(init.ones((num_features,)))
        self.bias = Parameter(init.zeros((num_features,)))
        self.register_buffer("running_mean", np.zeros(num_features, np.float32))
        self.register_buffer("running_var", np.ones(num_features, np.float32))

    def forward(self, x):
        x = _input(x, "BatchNorm2d")
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ShapeError(f"BatchNorm2d({self.num_features}): expected NCHW input with "
                             f"{self.num_features} channels, got shape {tuple(x.shape)}")
        if self.training:
            axes = (0, 2, 3)
            mu = ops.mean(x, axes)
            d = x - ops.reshape(mu, (1, -1, 1, 1))
            var = ops.mean(d * d, axes)
            if not x.is_tracer:
                n = x.size / x.shape[1]
                m = self.momentum
                self._set_buffer("running_mean", ((1 - m) * self.running_mean +
                                                  m * mu.numpy()).astype(np.float32))
                self._set_buffer("running_var", ((1 - m) * self.running_var +
                                                 m * var.numpy() * n / max(n - 1, 1))
                                 .astype(np.float32))
            return ops.batch_norm(x, mu, var, self.weight, self.bias, self.eps)
        return ops.batch_norm(x, Tensor(self.running_mean.astype(x.dtype)),
                              Tensor(self.running_var.astype(x.dtype)),
                              self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_features}"


class LayerNorm(Module):
    """Layer normalisation over the last axis."""

    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)) and len(normalized_shape) == 1:
            normalized_shape = normalized_shape[0]  # the last axis only, as (n,) or n
        check_sizes("LayerNorm", normalized_shape=normalized_shape)
        self.eps = eps
        self.weight = Parameter(init.ones((normalized_shape,)))
        self.bias = Parameter(init.zeros((normalized_shape,)))

    def forward(self, x):
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class ReLU(Module):
    """``relu(x)`` as a layer."""

    def forward(self, x):
        return ops.relu(x)


class Tanh(Module):
    """``tanh(x)`` as a layer."""

    def forward(self, x):
        return ops.tanh(x)


class Sigmoid(Module):
    """``sigmoid(x)`` as a layer."""

    def forward(self, x):
        return ops.sigmoid(x)


class Dropout(Module):
    """Zero activations with probability ``p`` while training; identity in eval mode.

    Raises:
        ArgumentError: ``p`` lies outside [0, 1] (checked here, as PyTorch does, not only on
            the first training call).
    """

    def __init__(self, p=0.5):
        super().__init__()
        self.p = check_dropout_p(p, "Dropout")

    def forward(self, x):
        return ops.dropout(x, self.p, training=self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    """(N, ...) -> (N, prod(...))."""

    def forward(self, x):
        x = _input(x, "Flatten")
        if x.ndim == 0:
            raise ShapeError("Flatten: input must have a batch dimension, got a 0-d tensor")
        return ops.reshape(x, (x.shape[0], -1))


class MaxPool2d(Module):
    """Max pooling over NCHW input (stride defaults to the window size)."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(MaxPool2d):
    """Average pooling over NCHW input (zero padding counts towards the mean)."""

    def forward(self, x):
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class Sequential(Module):
    """Apply layers in order."""

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x


cross_entropy = ops.cross_entropy
mse_loss = ops.mse_loss


__all__ = ["Linear", "Conv2d", "BatchNorm2d", "LayerNorm", "ReLU", "Tanh",
           "Sigmoid", "Dropout", "Flatten", "MaxPool2d", "AvgPool2d", "Sequential",
           "cross_entropy", "mse_loss"]
