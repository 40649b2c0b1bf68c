"""Exercise 2.2: evaluation (accuracy in eval mode, without the tape).

Wrong ideas rejected: argmax over the wrong axis, a percentage or a count differ from the
reference on five seeded models; forgetting model.eval() leaves Dropout on (the score changes
from call to call and differs from eval mode); setting `model.training = False` by hand leaves
the Dropout submodule training; always calling model.train() afterwards (instead of restoring the
mode it came in) shows on a model that came in eval mode; and forgetting ml.no_grad() shows in
the grad mode the model ran under.

Nothing is forbidden by name: the library has no accuracy helper that would do the exercise. The
reference ``_ref_accuracy`` is off limits to the student's code automatically.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch02_introduction.common import (
    as_float,
    blobs,
    expect_params,
    mlp,
    param_arrays,
    spy_class,
)


def _ref_accuracy(model, X, y):
    import mlsys_lab as ml

    was_training = model.training
    model.eval()
    with ml.no_grad():
        pred = np.argmax(model(ml.tensor(X)).numpy(), axis=1)
    model.train(was_training)
    return float(np.mean(pred == y))

def _random_models_probe(evaluate, seed):
    return [evaluate(mlp(30 + i), *blobs(seed * 5 + 20 + i, n=40 + 7 * i)) for i in range(5)]


def _random_models_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 5:
        raise AssertionError(f"evaluate on 5 models returned {describe(raw)}")
    for i, value in enumerate(raw):
        X, y = blobs(seed * 5 + 20 + i, n=40 + 7 * i)
        got = as_float(value, "evaluate")
        expected = _ref_accuracy(mlp(30 + i), X, y)
        if not np.isclose(got, expected, rtol=0, atol=1e-12):
            raise AssertionError(
                f"model #{i} on {len(X)} samples: accuracy {got!r}, expected {expected!r} "
                f"(the fraction of argmax(logits, axis=1) == y)"
            )


def _extremes_probe(evaluate):
    import mlsys_lab as ml

    X = np.eye(3, dtype=np.float32)
    model = ml.nn.Linear(3, 3, bias=False)
    model.weight.data = np.eye(3, dtype=np.float32)
    return [evaluate(model, X, np.array([0, 1, 2])), evaluate(model, X, np.array([1, 2, 0]))]


def _extremes_judge(raw):
    if not isinstance(raw, list) or len(raw) != 2:
        raise AssertionError(f"two calls of evaluate returned {describe(raw)}")
    right, wrong = (as_float(v, "evaluate") for v in raw)
    if right != 1.0:
        raise AssertionError(f"an identity model on its own one-hot rows scored {right!r}, "
                             f"expected 1.0")
    if wrong != 0.0:
        raise AssertionError(f"with every label wrong it scored {wrong!r}, expected 0.0")


def _dropout_probe(evaluate, seed):
    X, y = blobs(seed + 40, n=200)
    model = mlp(41, dropout=0.5)
    model.train()
    scores = [evaluate(model, X, y) for _ in range(3)]
    after_train = [m.training for m in model.modules()]
    model.eval()
    evaluate(model, X, y)
    return {"scores": scores, "after_train": after_train,
            "after_eval": [m.training for m in model.modules()]}


def _dropout_judge(raw, seed):
    X, y = blobs(seed + 40, n=200)
    expected = _ref_accuracy(mlp(41, dropout=0.5), X, y)
    if not isinstance(raw, dict) or not isinstance(raw.get("scores"), list):
        raise AssertionError(f"the check got {describe(raw)}")
    got = [as_float(v, "evaluate") for v in raw["scores"]]
    if any(not np.isclose(g, expected, rtol=0, atol=1e-12) for g in got):
        raise AssertionError(
            f"a model with Dropout(0.5) scored {got}; in eval mode it always scores "
            f"{expected!r}: call model.eval() first (it switches every submodule)"
        )
    after_train, after_eval = raw.get("after_train"), raw.get("after_eval")
    if not isinstance(after_train, list) or not after_train or not all(after_train):
        raise AssertionError(
            "the model was left in eval mode; put it back in the mode it was in "
            "(was_training = model.training ... model.train(was_training))"
        )
    if not isinstance(after_eval, list) or not after_eval or any(after_eval):
        raise AssertionError("a model that came in eval mode left in training mode")


def _no_tape_probe(evaluate, seed):
    spy = spy_class()(mlp(51))
    evaluate(spy, *blobs(seed + 50, n=30))
    return {"grad_modes": spy.grad_modes, "params": param_arrays(spy)}


def _no_tape_judge(raw, seed):
    if not isinstance(raw, dict) or not isinstance(raw.get("grad_modes"), list):
        raise AssertionError(f"the check got {describe(raw)}")
    if not raw["grad_modes"]:
        raise AssertionError("evaluate never called the model")
    if any(raw["grad_modes"]):
        raise AssertionError(
            "the model ran with the tape on; wrap evaluation in `with ml.no_grad():` (nothing "
            "is recorded for backward)"
        )
    spy = spy_class()(mlp(51))
    got = expect_params(raw.get("params"), spy, "evaluate")
    if any(not np.array_equal(got[name], p.numpy()) for name, p in spy.named_parameters()):
        raise AssertionError("evaluate changed the model's parameters")


register(
    Exercise(
        id="2.2",
        title="Evaluate accuracy",
        target="evaluate",
        task="the evaluation",
        forbidden=(),  # no library function computes accuracy
        cases=(
            Case("5 random models", 1.5, probe=_random_models_probe, judge=_random_models_judge),
            Case("all right = 1.0, all wrong = 0.0", 0.5,
                 probe=_extremes_probe, judge=_extremes_judge),
            Case("eval mode for Dropout, mode restored", 1,
                 probe=_dropout_probe, judge=_dropout_judge),
            Case("no tape, parameters untouched", 1, probe=_no_tape_probe, judge=_no_tape_judge),
        ),
    ),
)
