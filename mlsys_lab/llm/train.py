"""Train the committed tiny GPT: ``python -m mlsys_lab.llm.train`` (writes ``gpt_tiny.npz``).

The recipe, fixed so the file is reproducible (same numpy / BLAS: the same weights):

* text: :func:`~mlsys_lab.llm.text.corpus` (Python's ``pydoc_data`` topics), a 512-token BPE
  trained on it, the last 5 % of the tokens held out;
* model: :class:`~mlsys_lab.llm.model.GPTConfig` defaults (4 layers, d = 128, 4 heads, context
  256, 0.96 M parameters), seed 0;
* Adam, lr 1e-3 with 10 warm-up steps and a cosine decay to 1e-4, 200 steps of 4 windows of
  256 tokens (a peak of 3e-3 left the model at the unigram loss, 5.26, for 100 steps);
  attention composed from matmul and softmax (the op's formula; the op's numpy reference was
  slower for training on this machine);
* an early-exit loss (LayerSkip, Elhoushi et al. 2024): the same final norm and head also read
  the stream after block ``draft_layers``, weighted ``exit_weight``, so the model's first block
  alone is a usable *draft model* for speculative decoding (:meth:`GPT.truncated`);
* weights stored in float16 (``ml.save``, an .npz with a JSON header, no pickle).
"""

import argparse
import math
import os
import time

import numpy as np

from .. import ops
from ..engine.tensor import no_grad
from ..nn.checkpoint import save
from ..optim import Adam
from . import text
from .model import GPT, GPTConfig
from .pretrained import WEIGHTS, encode_corpus, heldout_loss
from .tokenizer import BPETokenizer


def exit_logits(model, ids, layers):
    """Logits (rows) after the full model and after its first ``layers`` blocks."""
    b, t = ids.shape
    x = model.tok(ids.reshape(-1)) + model.pos(np.tile(np.arange(t), b))
    early = None
    for i, block in enumerate(model.blocks):
        x = block(x, (b, t))
        if i + 1 == layers:
            early = model.head(model.ln_f(x))
    return model.head(model.ln_f(x)), early


def lr_at(step, steps, peak=1e-3, floor=1e-4, warmup=10):
    """Linear warm-up, then a cosine from ``peak`` down to ``floor``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * frac))


def train(steps=200, batch=4, context=256, draft_layers=1, exit_weight=0.5, seed=0,
          composed_attention=True, out=WEIGHTS, log=print):
    """Train and save the tiny GPT; return the metadata dict stored beside the weights."""
    start = time.perf_counter()
    corpus = text.corpus()
    tokenizer = BPETokenizer.train(corpus, vocab_size=512)
    train_ids, held = text.split(encode_corpus(tokenizer, corpus))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, context=context)
    model = GPT(config, seed=seed)
    for block in model.blocks:
        block.composed_attention = composed_attention
    opt = Adam(model.parameters(), lr=lr_at(0, steps))
    rng = np.random.default_rng(seed)
    data = text.batches(train_ids, batch, context, rng)
    first = last = None
    for step in range(steps):
        inputs, targets = next(data)
        full, early = exit_logits(model, inputs, draft_layers)
        flat = targets.reshape(-1)
        main = ops.cross_entropy(full, flat)
        total = main + exit_weight * ops.cross_entropy(early, flat)
        opt.zero_grad()
        total.backward()
        opt.hyper["lr"] = lr_at(step, steps)
        opt.step()
        last = float(main.numpy())
        first = last if first is None else first
        if step % 10 == 0 or step == steps - 1:
            log(f"step {step:4d}  loss {last:.3f}  lr {opt.hyper['lr']:.2e}  "
                f"{time.perf_counter() - start:6.0f} s")
    seconds = time.perf_counter() - start
    with no_grad():
        held_loss = heldout_loss(model, held, context)
        draft_loss = heldout_loss(model.truncated(draft_layers), held, context)
        window = held[None, :context]
        exact = model(window).numpy()
        state = {k: v.astype(np.float16) for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.astype(np.float32) for k, v in state.items()})
        half_loss = heldout_loss(model, held, context)
        half_change = float(np.abs(model(window).numpy() - exact).max())
    meta = {"steps": steps, "batch": batch, "seed": seed, "train_seconds": round(seconds, 1),
            "first_loss": first, "final_train_loss": last, "heldout_loss": held_loss,
            "draft_layers": draft_layers, "draft_heldout_loss": draft_loss,
            "float16_heldout_loss": half_loss, "float16_max_logit_change": half_change,
            "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held))}
    save({"config": dict(config.__dict__), "tokenizer": tokenizer.state(), "weights": state,
          "meta": meta}, out)
    log(f"held-out loss {held_loss:.3f} nats/token (draft: {draft_loss:.3f}); {seconds:.0f} s; "
        f"wrote {out} ({os.path.getsize(out) / 1e6:.2f} MB)")
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=WEIGHTS)
    args = parser.parse_args(argv)
    train(steps=args.steps, out=args.out, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    main()
