"""Seeding as Gymnasium does it: ``seed -> Generator(PCG64(SeedSequence(seed)))``."""

import numpy as np

from ...errors import ArgumentError


def np_random(seed=None):
    """A numpy generator and the seed it came from, exactly as ``gymnasium.utils.seeding``.

    Args:
        seed: a non-negative Python integer, or None for fresh entropy.

    Returns:
        ``(generator, seed)``: ``generator`` is ``numpy.random.Generator(PCG64(SeedSequence(
        seed)))``; ``seed`` is the sequence's entropy (the drawn one when ``seed`` is None).
    """
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                             or seed < 0):
        raise ArgumentError(f"np_random: the seed must be a non-negative integer, got {seed!r}")
    sequence = np.random.SeedSequence(None if seed is None else int(seed))
    return np.random.Generator(np.random.PCG64(sequence)), sequence.entropy
