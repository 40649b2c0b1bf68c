"""Exercise 2.1: one training epoch over mini-batches.

Wrong ideas rejected: no zero_grad (or one per epoch) accumulates gradients and zero_grad between
backward and step loses them, so the weights after one epoch of SGD with momentum differ from
the step-by-step reference; shuffling or dropping the short last batch shows in the rows the
model sees; the sample-weighted mean, the last batch's loss or a final full-data loss differ from
the mean of the batch losses (the last batch has 2 rows, not 16); and every dataset is drawn
from the seed, so no number can be copied.

Nothing is forbidden by name: the library has no training loop that would do the exercise. The
reference ``_ref_epoch`` is off limits to the student's code automatically (the guard refuses
every function of the exercise modules a probe does not use).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch02_introduction.common import (
    as_float,
    batch_loss,
    blobs,
    expect_params,
    mlp,
    param_arrays,
    spy_class,
)

_N, _BATCH = 50, 16  # batches of 16, 16, 16 and 2


def _ref_epoch(model, opt, X, y, batch_size):
    losses = []
    for start in range(0, len(X), batch_size):
        opt.zero_grad()
        loss = batch_loss(model, X[start : start + batch_size], y[start : start + batch_size])
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return sum(losses) / len(losses)

def _sgd_epoch_probe(train_epoch, seed):
    import mlsys_lab as ml

    X, y = blobs(seed + 1, n=_N)
    model = mlp(7)
    train_epoch(model, ml.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), X, y, _BATCH)
    return param_arrays(model)


def _sgd_epoch_judge(raw, seed):
    import mlsys_lab as ml

    X, y = blobs(seed + 1, n=_N)
    ref = mlp(7)
    _ref_epoch(ref, ml.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), X, y, _BATCH)
    start = param_arrays(mlp(7))
    got = expect_params(raw, ref, "train_epoch")
    for name, p in ref.named_parameters():
        if np.allclose(got[name], start[name]):
            raise AssertionError(
                f"parameter {name} did not change; call opt.step() after loss.backward() for "
                f"every batch"
            )
        if not np.allclose(got[name], p.numpy(), rtol=1e-4, atol=1e-5):
            raise AssertionError(
                f"after one epoch (50 samples, batch_size 16, SGD momentum 0.9) parameter {name} "
                f"differs from the expected update; take batches in order, and call "
                f"opt.zero_grad() before each loss.backward()"
            )


def _batches_probe(train_epoch, seed):
    import mlsys_lab as ml

    X, y = blobs(seed + 2, n=_N)
    X[:, 0] = np.arange(_N)  # every row is unique
    spy = spy_class()(mlp(3))
    train_epoch(spy, ml.optim.SGD(spy.parameters(), lr=0.0), X, y, _BATCH)
    return spy.seen


def _batches_judge(raw, seed):
    X, _ = blobs(seed + 2, n=_N)
    X[:, 0] = np.arange(_N)
    if not isinstance(raw, list) or not all(isinstance(b, np.ndarray) for b in raw):
        raise AssertionError(f"the model was called with {describe(raw)}")
    sizes = [len(b) for b in raw]
    if sizes != [16, 16, 16, 2]:
        raise AssertionError(
            f"with 50 samples and batch_size 16 the model saw batches of sizes {sizes}, "
            f"expected [16, 16, 16, 2]"
        )
    if not np.array_equal(np.concatenate(raw), X):
        raise AssertionError(
            "the batches are not X[0:16], X[16:32], ... in order (each sample exactly once)"
        )


def _mean_loss_probe(train_epoch, seed):
    import mlsys_lab as ml

    X, y = blobs(seed + 3, n=_N)
    model = mlp(5)
    return train_epoch(model, ml.optim.SGD(model.parameters(), lr=0.0), X, y, _BATCH)


def _mean_loss_judge(raw, seed):
    import mlsys_lab as ml

    X, y = blobs(seed + 3, n=_N)
    got = as_float(raw, "train_epoch")
    model = mlp(5)
    expected = _ref_epoch(model, ml.optim.SGD(model.parameters(), lr=0.0), X, y, _BATCH)
    if not np.isclose(got, expected, rtol=1e-5):
        per_sample = float(batch_loss(model, X, y).numpy())
        hint = (" (that is the mean over samples; average the 4 batch losses instead)"
                if np.isclose(got, per_sample, rtol=1e-5) else "")
        raise AssertionError(
            f"with lr=0 train_epoch returned {got:.6f}{hint}; the mean of the 4 batch losses "
            f"is {expected:.6f}"
        )


def _adam_losses(X, y, train):
    import mlsys_lab as ml

    model = mlp(11)
    opt = ml.optim.Adam(model.parameters(), lr=0.02)
    return [train(model, opt, X, y, 15) for _ in range(8)]


def _learns_probe(train_epoch, seed):
    return _adam_losses(*blobs(seed + 4, n=90), train_epoch)


def _learns_judge(raw, seed):
    expected = _adam_losses(*blobs(seed + 4, n=90), _ref_epoch)
    if not isinstance(raw, list) or len(raw) != 8:
        raise AssertionError(f"8 calls of train_epoch returned {describe(raw)}")
    got = [as_float(v, "train_epoch") for v in raw]
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-6):
        shown = ", ".join(f"{v:.3f}" for v in got)
        want = ", ".join(f"{v:.3f}" for v in expected)
        raise AssertionError(
            f"over 8 epochs with Adam (lr 0.02, batch_size 15) the mean loss went {shown}; "
            f"step-by-step training gives {want}"
        )


register(
    Exercise(
        id="2.1",
        title="One training epoch",
        target="train_epoch",
        task="the training loop",
        forbidden=(),  # no library function trains an epoch
        cases=(
            Case("one epoch equals step-by-step SGD", 2,
                 probe=_sgd_epoch_probe, judge=_sgd_epoch_judge),
            Case("batches in order, each sample once", 1,
                 probe=_batches_probe, judge=_batches_judge),
            Case("returns the mean batch loss", 1, probe=_mean_loss_probe, judge=_mean_loss_judge),
            Case("8 epochs of Adam: the loss falls as it should", 1,
                 probe=_learns_probe, judge=_learns_judge),
        ),
    ),
)
