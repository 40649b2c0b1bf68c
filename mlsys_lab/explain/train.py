"""Train the chapter's two models and write ``models.npz``: ``python -m mlsys_lab.explain.train``.

A few seconds on one core. The weights are stored in float32 (what was trained); :func:`load`
casts them to float64.
"""

import argparse

import numpy as np

from .. import ops
from ..nn.checkpoint import save
from ..optim import Adam
from .models import WEIGHTS, digits_cnn, digits_data, wine_data, wine_mlp


def _fit(model, x, y, epochs, batch, lr, seed):
    opt = Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            loss = ops.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


def _accuracy(model, x, y):
    return float((np.asarray(model(x).numpy()).argmax(axis=1) == y).mean())


def train(seed: int = 0, epochs: int = 12):
    """Train both models on 80 % of their data; returns (state dicts, meta)."""
    rng = np.random.default_rng(seed)
    out, meta = {}, {"seed": seed, "epochs": epochs}
    for name, (x, y), make in (("digits", digits_data(), digits_cnn),
                               ("wine", wine_data(), wine_mlp)):
        x = x.astype(np.float32)
        order = rng.permutation(len(x))
        cut = int(0.8 * len(x))
        tr, te = order[:cut], order[cut:]
        model = _fit(make(seed), x[tr], y[tr], epochs if name == "digits" else 4 * epochs,
                     32, 3e-3 if name == "digits" else 1e-2, seed)
        model.eval()
        meta[f"{name}_train_accuracy"] = _accuracy(model, x[tr], y[tr])
        meta[f"{name}_test_accuracy"] = _accuracy(model, x[te], y[te])
        meta[f"{name}_test_rows"] = " ".join(map(str, sorted(te.tolist())))
        out[name] = {k: np.asarray(v, np.float32) for k, v in model.state_dict().items()}
    return out, meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=WEIGHTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    weights, meta = train(args.seed)
    save({**weights, "meta": meta}, args.out)
    print({k: v for k, v in meta.items() if "accuracy" in k})


if __name__ == "__main__":
    main()
