"""The training text: Python's own documentation, shipped inside every CPython install.

``pydoc_data/topics.py`` holds the language reference's topics that ``help("if")`` shows: 79
topics of English prose with code in it; joined, 465,047 characters (466,194 bytes of UTF-8) on
CPython 3.11 (216,402 tokens of the 512-token BPE). Nothing is downloaded. The topics are
joined in sorted order, so the corpus is the same on every machine with the same Python, and
split by position into training and held-out text.
"""

import numpy as np

from ..errors import ArgumentError

SEPARATOR = "\n\n"


def corpus():
    """The documentation topics of ``pydoc_data.topics`` joined in sorted key order (a str)."""
    from pydoc_data.topics import topics

    return SEPARATOR.join(topics[k].strip() for k in sorted(topics))


def split(tokens, held_out=0.05):
    """``(train, held_out)``: the first ``1 - held_out`` of a token array and the rest."""
    if not 0.0 < held_out < 1.0:
        raise ArgumentError(f"split: held_out must be in (0, 1), got {held_out!r}")
    tokens = np.asarray(tokens)
    cut = int(round(len(tokens) * (1.0 - held_out)))
    return tokens[:cut], tokens[cut:]


def batches(tokens, batch_size, context, rng):
    """Endless ``(inputs, targets)`` pairs of shape (batch_size, context): random windows of
    ``tokens`` and the same windows shifted one token on (next-token prediction)."""
    tokens = np.asarray(tokens, np.int64)
    if len(tokens) <= context + 1:
        raise ArgumentError(f"batches: {len(tokens)} tokens are too few for context {context}")
    while True:
        starts = rng.integers(0, len(tokens) - context - 1, batch_size)
        window = tokens[starts[:, None] + np.arange(context + 1)]
        yield window[:, :-1], window[:, 1:]
