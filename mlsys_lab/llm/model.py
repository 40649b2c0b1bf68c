"""A tiny GPT (decoder-only transformer, as nanoGPT): token and position embeddings, pre-norm
blocks of causal self-attention and a GELU MLP, a final layer norm and a linear head.

Built from ``mlsys_lab.nn`` layers; attention is ``ml.ops.scaled_dot_product_attention``. The
same ``forward`` serves training (the whole window, ``is_causal``) and incremental decoding:
given a cache (:class:`~mlsys_lab.llm.kv_cache.KVCache` or
:class:`~mlsys_lab.llm.paged.PagedKVCache`), each layer appends the new tokens' keys and values
to it and attends over everything cached, so the new tokens' logits equal those of recomputing
the whole prefix.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

from .. import ops
from ..engine.tensor import Tensor, is_grad_enabled
from ..errors import ArgumentError, ShapeError
from ..nn import Embedding, LayerNorm, Linear, Module, Parameter, Sequential, init


@dataclass(frozen=True)
class GPTConfig:
    """A GPT's shape: vocabulary, context window, layers, width, heads (MLP width 4·dim)."""

    vocab_size: int = 512
    context: int = 256
    layers: int = 4
    dim: int = 128
    heads: int = 4

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ArgumentError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.dim % self.heads:
            raise ArgumentError(f"GPTConfig: dim {self.dim} is not divisible by heads "
                                f"{self.heads}")

    @property
    def head_dim(self):
        return self.dim // self.heads

    def kv_bytes_per_token(self, itemsize=4):
        """Bytes of K and V that one token keeps in the cache, over all layers."""
        return 2 * self.layers * self.dim * itemsize

    def decode_flops(self):
        """Multiply-adds x 2 of the weight matmuls for one token (attention excluded)."""
        d = self.dim
        return 2 * (self.layers * 12 * d * d + d * self.vocab_size)


def gelu(x):
    """GELU, tanh approximation (GPT-2): ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def attention(q, k, v, mask=None, causal=False, composed=False):
    """Scaled dot-product attention over (batch, heads, length, head_dim) tensors: the op
    ``ml.ops.scaled_dot_product_attention`` (PyTorch's semantics; ``mask`` True = attend).

    ``composed=True`` computes the same formula from ``matmul``, ``where`` and ``softmax``
    (what the training script used, before the op had fast kernels)."""
    if not composed:
        return ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
    if mask is not None:
        scores = ops.where(Tensor(np.asarray(mask, bool)), scores, float("-inf"))
    return ops.matmul(ops.softmax(scores, axis=-1), v)


class Block(Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, config, rng):
        super().__init__()
        d, self.heads = config.dim, config.heads
        self.composed_attention = False
        self.ln1, self.ln2 = LayerNorm(d), LayerNorm(d)
        self.qkv, self.proj = Linear(d, 3 * d), Linear(d, d)
        self.fc1, self.fc2 = Linear(d, 4 * d), Linear(4 * d, d)
        residual_std = 0.02 / math.sqrt(2 * config.layers)
        for layer, std in ((self.qkv, 0.02), (self.fc1, 0.02), (self.proj, residual_std),
                           (self.fc2, residual_std)):
            layer.weight = Parameter(init.normal(tuple(layer.weight.shape), rng, std=std))

    def forward(self, x, shape, cache=None, layer=0):
        """``x``: (batch·length, dim) rows; ``shape``: (batch, length)."""
        (b, t), h = shape, self.heads
        hd = x.shape[-1] // h
        # (3, b, h, t, hd) through a reshape that must copy: contiguous heads for the matmuls
        qkv = ops.transpose(ops.reshape(self.qkv(self.ln1(x)), (b, t, 3, h, hd)), (2, 0, 3, 1, 4))
        qkv = ops.reshape(ops.reshape(qkv, (3 * b * h, t, hd)), (3, b, h, t, hd))
        q, k, v = qkv[0], qkv[1], qkv[2]
        if cache is None:
            y = attention(q, k, v, causal=True, composed=self.composed_attention)
        else:
            keys, values, mask = cache.append(layer, k.numpy(), v.numpy())
            y = attention(q, Tensor(keys), Tensor(values), mask=mask,
                          composed=self.composed_attention)
        if is_grad_enabled():
            # a no-op forward; backward, the reshape copies the (transposed) gradient of y
            # into contiguous memory, which numpy's batched matmul needs to reach BLAS (25x)
            y = ops.reshape(ops.reshape(y, (b * h, t, hd)), (b, h, t, hd))
        x = x + self.proj(ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (b * t, h * hd)))
        return x + self.fc2(gelu(self.fc1(self.ln2(x))))


class GPT(Module):
    """A decoder-only transformer language model.

    Args:
        config: a :class:`GPTConfig`.
        seed: seed of the initial weights (N(0, 0.02²); the residual projections
            N(0, 0.02² / 2·layers), as GPT-2).

    ``model(ids)`` with ``ids`` of shape (batch, length) returns logits (batch, length, vocab);
    ``model(ids, cache)`` continues the sequences held in ``cache`` (see the module docstring).
    """

    def __init__(self, config=GPTConfig(), seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.config = config
        self.tok = Embedding(config.vocab_size, config.dim)
        self.pos = Embedding(config.context, config.dim)
        self.tok.weight = Parameter(init.normal((config.vocab_size, config.dim), rng, std=0.02))
        self.pos.weight = Parameter(init.normal((config.context, config.dim), rng, std=0.02))
        self.blocks = Sequential(*(Block(config, rng) for _ in range(config.layers)))
        self.ln_f = LayerNorm(config.dim)
        self.head = Linear(config.dim, config.vocab_size, bias=False)
        self.head.weight = Parameter(init.normal((config.dim, config.vocab_size), rng, std=0.02))

    def logits_2d(self, ids, cache=None):
        """Logits as (batch·length, vocab) rows (what the loss takes, without a reshape)."""
        ids = np.asarray(ids.numpy() if isinstance(ids, Tensor) else ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ShapeError(f"GPT: ids must be a 2-D integer array (batch, length), got "
                             f"{ids.dtype} of shape {ids.shape}")
        b, t = ids.shape
        start = np.zeros(b, np.int64) if cache is None else np.asarray(cache.lengths, np.int64)
        if start.shape != (b,):
            raise ShapeError(f"GPT: a cache of {start.shape[0]} sequences for a batch of {b}")
        if t == 0 or int(start.max(initial=0)) + t > self.config.context:
            raise ShapeError(f"GPT: positions {int(start.max(initial=0))}..+{t} do not fit the "
                             f"context of {self.config.context} tokens")
        positions = start[:, None] + np.arange(t)
        x = self.tok(ids.reshape(-1).astype(np.int64)) + self.pos(positions.reshape(-1))
        for i, block in enumerate(self.blocks):
            x = block(x, (b, t), cache, i)
        if cache is not None:
            cache.advance(t)
        return self.head(self.ln_f(x))

    def forward(self, ids, cache=None):
        logits = self.logits_2d(ids, cache)
        b, t = tuple(ids.shape) if hasattr(ids, "shape") else np.shape(ids)
        return ops.reshape(logits, (b, t, self.config.vocab_size))

    def truncated(self, layers):
        """A draft model: the first ``layers`` blocks of this one, with its embeddings, final
        norm and head (shared weights, no copy)."""
        if not 1 <= layers <= self.config.layers:
            raise ArgumentError(f"GPT.truncated: layers must be in 1..{self.config.layers}, "
                                f"got {layers}")
        config = GPTConfig(**{**asdict(self.config), "layers": layers})
        draft = GPT.__new__(GPT)
        Module.__init__(draft)
        draft.config = config
        draft.tok, draft.pos, draft.ln_f, draft.head = self.tok, self.pos, self.ln_f, self.head
        draft.blocks = Sequential(*list(self.blocks)[:layers])
        return draft


def loss(model, inputs, targets):
    """Mean next-token cross-entropy (nats per token) of ``model`` on a batch."""
    return ops.cross_entropy(model.logits_2d(inputs), np.asarray(targets, np.int64).reshape(-1))
