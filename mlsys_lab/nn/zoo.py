"""Small reference models used by the chapters, tests and benchmarks."""

import numpy as np

from .. import ops
from .layers import BatchNorm2d, Conv2d, Flatten, LayerNorm, Linear, ReLU, Sequential
from .module import Module


def mlp(sizes=(784, 256, 256, 10), seed=0):
    """Linear-ReLU layers of the given widths (no ReLU after the last)."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Linear(a, b, rng=seed + i))
        if i < len(sizes) - 2:
            layers.append(ReLU())
    return Sequential(*layers)


class ResidualBlock(Module):
    """conv-BN-ReLU-conv-BN plus the identity shortcut, then ReLU (the book's residual block)."""

    def __init__(self, channels, seed=0):
        super().__init__()
        self.conv1 = Conv2d(channels, channels, 3, padding=1, bias=False, rng=seed)
        self.bn1 = BatchNorm2d(channels)
        self.conv2 = Conv2d(channels, channels, 3, padding=1, bias=False, rng=seed + 1)
        self.bn2 = BatchNorm2d(channels)

    def forward(self, x):
        out1 = ops.relu(self.bn1(self.conv1(x)))
        out2 = self.bn2(self.conv2(out1))
        return ops.relu(out2 + x)


def resnet_cnn(channels=8, blocks=2, num_classes=10, image=8, seed=0):
    """A tiny ResNet-style CNN for 1-channel ``image``×``image`` inputs."""
    layers = [Conv2d(1, channels, 3, padding=1, rng=seed), ReLU()]
    layers += [ResidualBlock(channels, seed + 10 * (i + 1)) for i in range(blocks)]
    layers += [Flatten(), Linear(channels * image * image, num_classes, rng=seed + 99)]
    return Sequential(*layers)


class TransformerBlock(Module):
    """Pre-norm transformer block: multi-head self-attention and an MLP, both residual."""

    def __init__(self, dim=32, heads=4, hidden=64, seed=0):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = LayerNorm(dim), LayerNorm(dim)
        self.qkv = Linear(dim, 3 * dim, rng=seed)
        self.proj = Linear(dim, dim, rng=seed + 1)
        self.fc1, self.fc2 = Linear(dim, hidden, rng=seed + 2), Linear(hidden, dim, rng=seed + 3)

    def forward(self, x):  # x: (batch, seq, dim)
        b, t, d = x.shape
        h = self.heads
        qkv = ops.reshape(self.qkv(self.ln1(x)), (b, t, 3, h, d // h))
        q, k, v = (ops.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
        att = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / float(np.sqrt(d // h)))
        y = ops.reshape(ops.transpose(ops.matmul(att, v), (0, 2, 1, 3)), (b, t, d))
        x = x + self.proj(y)
        return x + self.fc2(ops.relu(self.fc1(self.ln2(x))))


class TransformerClassifier(Module):
    """A transformer block followed by mean pooling over the sequence and a linear head."""

    def __init__(self, dim=32, heads=4, hidden=64, num_classes=10, seed=0):
        super().__init__()
        self.block = TransformerBlock(dim, heads, hidden, seed)
        self.head = Linear(dim, num_classes, rng=seed + 7)

    def forward(self, x):
        return self.head(ops.mean(self.block(x), axis=1))
