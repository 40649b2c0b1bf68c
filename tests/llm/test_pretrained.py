"""The committed weights: a small float16 file that loads into a GPT whose held-out loss is the
one the training script recorded."""

import os

import numpy as np

import mlsys_lab as ml
from mlsys_lab import llm
from mlsys_lab.llm import text


def test_committed_weights_load_and_reach_the_stated_loss():
    assert os.path.getsize(llm.WEIGHTS) <= 4 * 2**20
    raw = ml.load(llm.WEIGHTS)
    assert all(np.asarray(w).dtype == np.float16 for w in raw["weights"].values())
    pre = llm.load()
    assert pre.model.config == llm.GPTConfig()  # 4 layers, d = 128, 4 heads, context 256
    held = text.split(llm.pretrained.encode_corpus(pre.tokenizer))[1]
    with ml.no_grad():
        logits = pre.model(held[None, :64]).numpy()
    assert np.isfinite(logits).all()
    loss = llm.heldout_loss(pre.model, held)
    # The corpus is the running Python's pydoc topics: the training's own text on 3.11 (CI's
    # Python); 3.12 and 3.13 rewrote some topics, so their held-out part is other text (the
    # bound below still holds there).
    if len(held) == pre.meta["heldout_tokens"]:
        assert abs(loss - pre.meta["float16_heldout_loss"]) < 1e-3
    assert loss < pre.meta["first_loss"] - 0.8 and loss < 5.0  # below the unigram's 5.26
    assert pre.tokenizer.decode(pre.tokenizer.encode("for x in y:")) == "for x in y:"
