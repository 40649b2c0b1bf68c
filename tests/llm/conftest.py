"""A tiny random GPT shared by the llm tests (2 layers, d = 32, vocabulary 61, context 64)."""

import pytest

from mlsys_lab import llm


@pytest.fixture(scope="session")
def tiny():
    config = llm.GPTConfig(vocab_size=61, context=64, layers=2, dim=32, heads=4)
    return llm.GPT(config, seed=1).eval()
