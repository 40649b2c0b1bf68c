"""Tokenizers: raw bytes, and a byte-level BPE (GPT-2's scheme) trained on the corpus.

Both work on UTF-8 bytes, so any string round-trips exactly: ``decode(encode(s)) == s``.

Byte-pair encoding (Sennrich et al. 2016; GPT-2's byte-level variant): start from the 256 byte
values, and repeatedly merge the most frequent adjacent pair of tokens into a new token. Text is
first cut into pieces (a word with its leading space, a run of digits, of punctuation, of
whitespace) and merges never cross a piece boundary, so training counts pairs over the distinct
pieces only. Ties between equally frequent pairs go to the smallest pair of ids, which makes
training deterministic.
"""

import re
from collections import Counter

import numpy as np

from ..errors import ArgumentError

#: GPT-2's pre-tokenizer, ASCII edition: a word, number or punctuation run with its one leading
#: space, or a run of whitespace (the last space of a run is left for the next word).
PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


class ByteTokenizer:
    """Tokens are the UTF-8 bytes: vocabulary 256, no training."""

    vocab_size = 256

    def encode(self, text):
        """The token ids (int64 array) of ``text``."""
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)

    def decode(self, ids):
        """The text of token ids (invalid UTF-8 from a partial sample shows as U+FFFD)."""
        return bytes(np.asarray(ids, np.uint8)).decode("utf-8", errors="replace")


class BPETokenizer:
    """A byte-level BPE: ids 0..255 are bytes, id ``256 + i`` is the ``i``-th merge.

    Build one with :meth:`train`, or from saved ``merges`` (an (n, 2) int array, as
    :meth:`state` returns it).
    """

    def __init__(self, merges):
        merges = np.asarray(merges, np.int64).reshape(-1, 2)
        self.merges = merges
        self.ranks = {(int(a), int(b)): i for i, (a, b) in enumerate(merges)}
        self.vocab = [bytes([i]) for i in range(256)]
        for i, (a, b) in enumerate(merges):
            if not (0 <= a < 256 + i and 0 <= b < 256 + i):
                raise ArgumentError(f"BPETokenizer: merge {i} = ({a}, {b}) refers to a token "
                                    f"not defined before it")
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self._cache = {}

    @property
    def vocab_size(self):
        return 256 + len(self.merges)

    @classmethod
    def train(cls, text, vocab_size=512):
        """Learn ``vocab_size - 256`` merges from ``text`` (deterministic)."""
        if vocab_size < 256:
            raise ArgumentError(f"BPETokenizer.train: vocab_size must be >= 256, got "
                                f"{vocab_size}")
        words = {tuple(p.encode("utf-8")): n for p, n in Counter(PIECE.findall(text)).items()}
        merges = []
        for new in range(256, vocab_size):
            pairs = Counter()
            for w, n in words.items():
                for pair in zip(w, w[1:]):
                    pairs[pair] += n
            if not pairs:
                break
            best = min(pairs, key=lambda p: (-pairs[p], p))
            merges.append(best)
            words = {_merge(w, best, new): n for w, n in words.items()}
        return cls(np.array(merges, np.int64).reshape(-1, 2))

    def state(self):
        """What a checkpoint stores: ``{"merges": (n, 2) int64 array}``."""
        return {"merges": self.merges.copy()}

    def _encode_piece(self, piece):
        ids = self._cache.get(piece)
        if ids is None:
            word = tuple(piece.encode("utf-8"))
            while len(word) > 1:
                pair = min(zip(word, word[1:]), key=lambda p: self.ranks.get(p, 1 << 60))
                rank = self.ranks.get(pair)
                if rank is None:
                    break
                word = _merge(word, pair, 256 + rank)
            self._cache[piece] = ids = word
        return ids

    def encode(self, text):
        """The token ids (int64 array) of ``text``: each piece's bytes, merged in rank order."""
        out = []
        for piece in PIECE.findall(text):
            out.extend(self._encode_piece(piece))
        return np.array(out, np.int64)

    def decode(self, ids):
        """The text of token ids (invalid UTF-8 from a partial sample shows as U+FFFD)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ArgumentError(f"BPETokenizer.decode: ids must lie in [0, {self.vocab_size}), "
                                f"got {ids.min()}..{ids.max()}")
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def _merge(word, pair, new):
    """``word`` (a tuple of ids) with every non-overlapping ``pair``, left to right, -> ``new``."""
    out, i, a, b = [], 0, pair[0], pair[1]
    n = len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
