"""Tokenizers (exact round trips, deterministic BPE) and the sampler's masks."""

import numpy as np
import pytest

from mlsys_lab import ArgumentError, llm
from mlsys_lab.llm import text

SAMPLE = "def f(x):\n    return x ** 2  # the square\n\tüñí©ødé 𝄞 text, with  spaces   \n\n"


def test_byte_tokenizer_round_trips_any_text():
    tok = llm.ByteTokenizer()
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
    assert tok.encode("é").tolist() == [0xC3, 0xA9]


def test_bpe_is_deterministic_round_trips_and_compresses():
    corpus = text.corpus()[:20000]
    a = llm.BPETokenizer.train(corpus, vocab_size=300)
    b = llm.BPETokenizer.train(corpus, vocab_size=300)
    assert np.array_equal(a.merges, b.merges)
    assert a.vocab_size == 300
    for s in (corpus[:3000], SAMPLE, ""):
        assert a.decode(a.encode(s)) == s
    ids = a.encode(corpus)
    assert len(ids) < 0.7 * len(corpus.encode())  # merges shorten the text
    # the most frequent pair of the corpus's pieces is the first merge
    first = a.vocab[256]
    assert len(first) == 2 and corpus.count(first.decode()) > 100


def test_bpe_from_saved_merges_encodes_alike():
    tok = llm.BPETokenizer.train(text.corpus()[:5000], vocab_size=280)
    again = llm.BPETokenizer(tok.state()["merges"])
    assert np.array_equal(again.encode(SAMPLE), tok.encode(SAMPLE))
    with pytest.raises(ArgumentError, match="merge 0"):
        llm.BPETokenizer([[300, 1]])


def test_corpus_ships_with_python():
    corpus = text.corpus()
    assert len(corpus) > 400_000 and "while" in corpus
    train, held = text.split(np.arange(100))
    assert len(train) == 95 and held[0] == 95


def test_top_k_keeps_the_k_largest():
    logits = np.array([[0.1, 3.0, -1.0, 2.0, 2.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    assert llm.top_k_mask(logits, 2).tolist() == [[False, True, False, False, True],
                                                 [True, True, False, False, False]]
    assert llm.top_k_mask(logits, 9).all()


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = np.array([0.05, 0.5, 0.1, 0.3, 0.05])
    assert llm.top_p_mask(probs, 0.5).tolist() == [False, True, False, False, False]
    assert llm.top_p_mask(probs, 0.8).tolist() == [False, True, False, True, False]
    assert llm.top_p_mask(probs, 0.81).tolist() == [False, True, True, True, False]
    assert llm.top_p_mask(probs, 1.0).all()


def test_probabilities_apply_temperature_then_masks():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    p = llm.probabilities(logits, temperature=0.5)
    assert np.allclose(p, np.array([1, 4, 9, 16]) / 30)
    p = llm.probabilities(logits, top_k=2)
    assert np.allclose(p, [0, 0, 3 / 7, 4 / 7])
    p = llm.probabilities(logits, top_p=0.6)
    assert np.allclose(p, [0, 0, 3 / 7, 4 / 7])
    assert llm.probabilities(logits, temperature=0).tolist() == [0, 0, 0, 1]


def test_seeded_sampling_follows_the_distribution():
    p = np.array([0.1, 0.0, 0.6, 0.3])
    rng = np.random.default_rng(0)
    draws = llm.sampling.draw(np.tile(p, (20000, 1)), rng)
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[1] == 0 and np.abs(freq - p).max() < 0.015
    a = llm.sample(np.log(p + 1e-12), np.random.default_rng(5))
    b = llm.sample(np.log(p + 1e-12), np.random.default_rng(5))
    assert a == b
