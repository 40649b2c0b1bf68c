"""The committed tiny GPT (``gpt_tiny.npz``, made by ``python -m mlsys_lab.llm.train``).

:func:`load` returns the model (float32 weights from the float16 file), its tokenizer and the
training metadata; :func:`heldout_loss` measures a model on held-out tokens.
"""

import os
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..engine.tensor import no_grad
from ..errors import CheckpointError
from ..nn.checkpoint import load as load_checkpoint
from . import text
from .model import GPT, GPTConfig
from .tokenizer import BPETokenizer

#: Where the committed weights live (package data).
WEIGHTS = os.path.join(os.path.dirname(__file__), "gpt_tiny.npz")


@dataclass
class Pretrained:
    """What :func:`load` returns: ``model``, ``tokenizer``, ``meta`` (training record)."""

    model: GPT
    tokenizer: BPETokenizer
    meta: dict


def encode_corpus(tokenizer, corpus=None):
    """The corpus as token ids (int64)."""
    return tokenizer.encode(text.corpus() if corpus is None else corpus)


def load(path=WEIGHTS):
    """Load the committed model (or another file written by the training script).

    Raises:
        CheckpointError: the file is missing, damaged or not a GPT checkpoint.
    """
    ckpt = load_checkpoint(path)
    try:
        config = GPTConfig(**ckpt["config"])
        tokenizer = BPETokenizer(ckpt["tokenizer"]["merges"])
        weights, meta = ckpt["weights"], ckpt["meta"]
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"load: {path} is not a GPT checkpoint (missing {e})") from None
    model = GPT(config)
    model.load_state_dict({k: np.asarray(v, np.float32) for k, v in weights.items()})
    return Pretrained(model.eval(), tokenizer, meta)


def heldout_loss(model, tokens, context=None, windows=None):
    """Mean next-token cross-entropy (nats/token) over consecutive windows of ``tokens``.

    Args:
        model: a GPT (or anything with ``logits_2d``).
        tokens: token ids; cut into non-overlapping windows of ``context + 1``.
        context: window length (default: the model's context).
        windows: use only the first this many windows.
    """
    context = model.config.context if context is None else context
    tokens = np.asarray(tokens, np.int64)
    n = (len(tokens) - 1) // context
    n = n if windows is None else min(n, windows)
    total = 0.0
    with no_grad():
        for i in range(n):
            w = tokens[i * context: (i + 1) * context + 1]
            total += float(ops.cross_entropy(model.logits_2d(w[None, :-1]), w[1:]).numpy())
    return total / max(n, 1)
