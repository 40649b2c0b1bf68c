"""Checks for chapter 2, the introduction (``solutions/ch02_introduction.ipynb``).

The end-to-end job of a framework, one piece per exercise: 2.1 one training epoch over
mini-batches, 2.2 evaluation (accuracy in eval mode, without the tape), 2.3 a checkpoint that
restores the model *and* the optimiser so training resumes exactly. Every model and data set
here is small, synthetic and seeded.
"""

from __future__ import annotations

import numbers
import os
import tempfile

import numpy as np

from mlsys_lab.grading.checks import Case, Exercise, register

# ----------------------------------------------------------------------------- fixtures


def _blobs(seed: int, n: int = 60, features: int = 4, classes: int = 3):
    """Gaussian blobs: float32 features (n, features) and int64 labels (n,)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, features)) * 2.5
    y = rng.integers(0, classes, n)
    X = centers[y] + rng.standard_normal((n, features))
    return X.astype(np.float32), y.astype(np.int64)


def _mlp(seed: int, features: int = 4, classes: int = 3, dropout: float = 0.0):
    import mlsys_lab as ml

    layers = [ml.nn.Linear(features, 16, rng=seed), ml.nn.ReLU()]
    if dropout:
        layers.append(ml.nn.Dropout(dropout))
    layers.append(ml.nn.Linear(16, classes, rng=seed + 1))
    return ml.nn.Sequential(*layers)


def _params(model):
    return [p.numpy().copy() for p in model.parameters()]


def _batch_loss(model, xb, yb):
    import mlsys_lab as ml

    return ml.nn.cross_entropy(model(ml.tensor(xb)), ml.tensor(yb))


def _ref_epoch(model, opt, X, y, batch_size):
    losses = []
    for start in range(0, len(X), batch_size):
        opt.zero_grad()
        loss = _batch_loss(model, X[start : start + batch_size], y[start : start + batch_size])
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return sum(losses) / len(losses)


def _ref_accuracy(model, X, y):
    import mlsys_lab as ml

    was_training = model.training
    model.eval()
    with ml.no_grad():
        pred = np.argmax(model(ml.tensor(X)).numpy(), axis=1)
    model.train(was_training)
    return float(np.mean(pred == y))


def _spy_class():
    import mlsys_lab as ml

    class Spy(ml.nn.Module):
        """Wraps a model; records each batch it sees and whether the tape was on."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            object.__setattr__(self, "seen", [])
            object.__setattr__(self, "grad_modes", [])

        def forward(self, x):
            self.seen.append(np.array(x, copy=True))
            self.grad_modes.append(ml.is_grad_enabled())
            return self.inner(x)

    return Spy


def _as_float(value, what):
    import mlsys_lab as ml

    if isinstance(value, ml.Tensor):
        raise AssertionError(
            f"{what} returned a Tensor; return a Python float (loss.item() or float(loss.numpy()))"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AssertionError(f"{what} returned {type(value).__name__}, expected a float")
    return float(value)


# ----------------------------------------------------------------------------- 2.1 train_epoch


def _epoch_matches_reference(train_epoch):
    import mlsys_lab as ml

    X, y = _blobs(1, n=50)
    mine, ref = _mlp(7), _mlp(7)
    opt_mine = ml.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    opt_ref = ml.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    _as_float(train_epoch(mine, opt_mine, X, y, 16), "train_epoch")
    _ref_epoch(ref, opt_ref, X, y, 16)
    for (name, p), q in zip(mine.named_parameters(), ref.parameters(), strict=True):
        if np.allclose(p.numpy(), _mlp(7).state_dict()[name]):
            raise AssertionError(
                f"parameter {name} did not change; call opt.step() after "
                f"loss.backward() for every batch"
            )
        if not np.allclose(p.numpy(), q.numpy(), rtol=1e-4, atol=1e-5):
            raise AssertionError(
                f"after one epoch (50 samples, batch_size 16, SGD momentum 0.9) parameter "
                f"{name} differs from the expected update; take batches in order, and call "
                f"opt.zero_grad() before each loss.backward()"
            )


def _epoch_batches(train_epoch):
    import mlsys_lab as ml

    X, y = _blobs(2, n=50)
    X[:, 0] = np.arange(50)  # every row is unique
    spy = _spy_class()(_mlp(3))
    train_epoch(spy, ml.optim.SGD(spy.parameters(), lr=0.0), X, y, 16)
    sizes = [len(b) for b in spy.seen]
    if sizes != [16, 16, 16, 2]:
        raise AssertionError(
            f"with 50 samples and batch_size 16 the model saw batches of sizes "
            f"{sizes}, expected [16, 16, 16, 2]"
        )
    if not np.array_equal(np.concatenate(spy.seen), X):
        raise AssertionError(
            "the batches are not X[0:16], X[16:32], ... in order (each sample exactly once)"
        )


def _epoch_mean_loss(train_epoch):
    import mlsys_lab as ml

    X, y = _blobs(3, n=50)
    model = _mlp(5)
    loss = _as_float(
        train_epoch(model, ml.optim.SGD(model.parameters(), lr=0.0), X, y, 16), "train_epoch"
    )
    expected = _ref_epoch(_mlp(5), ml.optim.SGD(_mlp(5).parameters(), lr=0.0), X, y, 16)
    if not np.isclose(loss, expected, rtol=1e-5):
        raise AssertionError(
            f"with lr=0 train_epoch returned {loss:.6f}; the mean of the 4 "
            f"batch losses is {expected:.6f}"
        )


def _epoch_learns(train_epoch):
    import mlsys_lab as ml

    X, y = _blobs(4, n=90)
    model = _mlp(11)
    opt = ml.optim.Adam(model.parameters(), lr=0.02)
    losses = [_as_float(train_epoch(model, opt, X, y, 15), "train_epoch") for _ in range(8)]
    if not losses[-1] < 0.5 * losses[0]:
        shown = ", ".join(f"{v:.3f}" for v in losses)
        raise AssertionError(
            f"over 8 epochs with Adam the loss went {shown}; it should fall "
            f"below half its first value"
        )


# ----------------------------------------------------------------------------- 2.2 evaluate


def _eval_random(evaluate):
    for seed in range(5):
        X, y = _blobs(20 + seed, n=40 + 7 * seed)
        model = _mlp(30 + seed)
        got = _as_float(evaluate(model, X, y), "evaluate")
        expected = _ref_accuracy(model, X, y)
        if not np.isclose(got, expected, rtol=0, atol=1e-12):
            raise AssertionError(
                f"model #{seed} on {len(X)} samples: accuracy {got!r}, expected "
                f"{expected!r} (the fraction of argmax(logits) == y)"
            )


def _eval_perfect_and_wrong(evaluate):
    import mlsys_lab as ml

    X = np.eye(3, dtype=np.float32)
    model = ml.nn.Linear(3, 3, bias=False)
    model.weight.data = np.eye(3, dtype=np.float32)
    y = np.array([0, 1, 2])
    got = _as_float(evaluate(model, X, y), "evaluate")
    if got != 1.0:
        raise AssertionError(
            f"an identity model on its own one-hot rows scored {got!r}, expected 1.0"
        )
    got = _as_float(evaluate(model, X, np.array([1, 2, 0])), "evaluate")
    if got != 0.0:
        raise AssertionError(f"with every label wrong it scored {got!r}, expected 0.0")


def _eval_dropout(evaluate):
    X, y = _blobs(40, n=200)
    model = _mlp(41, dropout=0.5)
    model.train()
    expected = _ref_accuracy(model, X, y)
    got = [_as_float(evaluate(model, X, y), "evaluate") for _ in range(3)]
    if any(not np.isclose(g, expected, atol=1e-12) for g in got):
        raise AssertionError(
            f"a model with Dropout(0.5) scored {got}; in eval mode it always "
            f"scores {expected!r}: call model.eval() first"
        )
    if not model.training:
        raise AssertionError(
            "the model was left in eval mode; put it back in the mode it was "
            "in (model.train(was_training))"
        )
    model.eval()
    evaluate(model, X, y)
    if model.training:
        raise AssertionError("a model that came in eval mode left in training mode")


def _eval_no_tape(evaluate):
    X, y = _blobs(50, n=30)
    spy = _spy_class()(_mlp(51))
    before = _params(spy)
    evaluate(spy, X, y)
    if not spy.grad_modes:
        raise AssertionError("evaluate never called the model")
    if any(spy.grad_modes):
        raise AssertionError(
            "the model ran with the tape on; wrap evaluation in "
            "`with ml.no_grad():` (nothing is recorded for backward)"
        )
    if any(not np.array_equal(a, b) for a, b in zip(before, _params(spy), strict=True)):
        raise AssertionError("evaluate changed the model's parameters")


# ----------------------------------------------------------------------------- 2.3 checkpoints


def _train_steps(model, opt, steps, seed):
    X, y = _blobs(seed, n=24)
    for i in range(steps):
        opt.zero_grad()
        sl = slice((i * 8) % 24, (i * 8) % 24 + 8)
        _batch_loss(model, X[sl], y[sl]).backward()
        opt.step()


def _find_arrays(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _find_arrays(v)
    elif isinstance(obj, np.ndarray):
        yield obj


def _ckpt_file(save_checkpoint, load_checkpoint):
    import mlsys_lab as ml

    model = _mlp(60)
    opt = ml.optim.Adam(model.parameters(), lr=0.01)
    _train_steps(model, opt, 2, 61)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        save_checkpoint(path, model, opt)
        if not os.path.exists(path):
            raise AssertionError("save_checkpoint(path, ...) wrote no file at path")
        try:
            stored = ml.load(path)
        except ml.CheckpointError as error:
            raise AssertionError(
                f"ml.load cannot read the file: {error}; write it with ml.save"
            ) from None
    arrays = list(_find_arrays(stored))
    for name, p in model.named_parameters():
        if not any(a.shape == p.shape and np.array_equal(a, p.numpy()) for a in arrays):
            raise AssertionError(
                f"the checkpoint does not hold parameter {name}; save model.state_dict()"
            )


def _round_trip(save_checkpoint, load_checkpoint, model, opt, into, into_opt):
    """Save ``model`` and ``opt`` with the student's function, then load them into ``into`` and
    ``into_opt`` (through a file in a temporary folder)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        save_checkpoint(path, model, opt)
        load_checkpoint(path, into, into_opt)


def _ckpt_predictions(save_checkpoint, load_checkpoint):
    import mlsys_lab as ml

    X, _ = _blobs(62, n=20)
    model = _mlp(63)
    opt = ml.optim.Adam(model.parameters(), lr=0.01)
    _train_steps(model, opt, 3, 64)
    fresh = _mlp(99)
    fresh_opt = ml.optim.Adam(fresh.parameters(), lr=0.01)
    _round_trip(save_checkpoint, load_checkpoint, model, opt, fresh, fresh_opt)
    with ml.no_grad():
        a, b = model(ml.tensor(X)).numpy(), fresh(ml.tensor(X)).numpy()
    if not np.array_equal(a, b):
        raise AssertionError(
            "a fresh model loaded from the checkpoint predicts differently from the saved one"
        )
    fresh.parameters()[0].data[...] = 0.0
    if not np.any(model.parameters()[0].numpy()):
        raise AssertionError("the restored model shares arrays with the original")


def _ckpt_resume(save_checkpoint, load_checkpoint):
    import mlsys_lab as ml

    model = _mlp(70)
    opt = ml.optim.Adam(model.parameters(), lr=0.01)
    _train_steps(model, opt, 3, 71)
    resumed = _mlp(72)
    resumed_opt = ml.optim.Adam(resumed.parameters(), lr=0.01)
    _round_trip(save_checkpoint, load_checkpoint, model, opt, resumed, resumed_opt)
    _train_steps(model, opt, 3, 73)  # uninterrupted
    _train_steps(resumed, resumed_opt, 3, 73)  # stopped, saved, restored, continued
    same = all(
        np.allclose(p.numpy(), q.numpy(), rtol=1e-6, atol=1e-7)
        for p, q in zip(model.parameters(), resumed.parameters(), strict=True)
    )
    if not same:
        raise AssertionError(
            "training resumed from the checkpoint drifts from uninterrupted training; save and "
            "restore the optimiser too (opt.state_dict(): Adam's moments and step count)"
        )


register(
    Exercise(
        id="2.1",
        title="One training epoch",
        target="train_epoch",
        cases=(
            Case("one epoch equals step-by-step SGD", 2, _epoch_matches_reference),
            Case("batches in order, each sample once", 1, _epoch_batches),
            Case("returns the mean batch loss", 1, _epoch_mean_loss),
            Case("the loss falls over 8 epochs", 1, _epoch_learns),
        ),
    ),
    Exercise(
        id="2.2",
        title="Evaluate accuracy",
        target="evaluate",
        cases=(
            Case("5 random models", 1.5, _eval_random),
            Case("all right = 1.0, all wrong = 0.0", 0.5, _eval_perfect_and_wrong),
            Case("eval mode for Dropout, mode restored", 1, _eval_dropout),
            Case("no tape, parameters untouched", 1, _eval_no_tape),
        ),
    ),
    Exercise(
        id="2.3",
        title="Checkpoint and resume",
        target=("save_checkpoint", "load_checkpoint"),
        cases=(
            Case("the file is an ml checkpoint of the weights", 1, _ckpt_file),
            Case("restored model predicts identically", 1.5, _ckpt_predictions),
            Case("resumed training equals uninterrupted", 1.5, _ckpt_resume),
        ),
    ),
)
