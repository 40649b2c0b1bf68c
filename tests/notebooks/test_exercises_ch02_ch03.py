"""Exercises 2.1–3.3 test their idea: shortcuts and wrong ideas with plausible output score 0 on
the cases that test the idea, honest answers (including LoRA's initialisation) score full marks.

Most tests run the checks in this process (``run_cases``); one grades a real notebook, because
2.3 rebuilds ``load_checkpoint`` from a notebook cell's source in a fresh process.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine.registry import REGISTRY, AVal, Op, register
from mlsys_lab.engine.tensor import apply
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import exercises_for_chapter
from mlsys_lab.grading.core.grader import grade

ROOT = Path(__file__).resolve().parents[2]
CH02_EXERCISE = ROOT / "exercises" / "ch02_introduction.ipynb"


def _points(result) -> dict[str, float]:
    return {row.name: row.points for row in result.rows}


def _feedback(result) -> str:
    return " | ".join(row.feedback for row in result.rows)


def _zero_on(result, *cases):
    """The named cases scored 0 (each name must exist)."""
    points = _points(result)
    assert all(name in points for name in cases), sorted(points)
    assert all(points[name] == 0 for name in cases), result.report()


    assert {e.id for e in exercises_for_chapter(2) + exercises_for_chapter(3)} == {
        "2.1", "2.2", "2.3", "3.1", "3.2", "3.3"}


# ----------------------------------------------------------------------------- 2.1 train_epoch


def _epoch(model, opt, X, y, batch_size, order=None, zero_grad=True, weighted=False):
    order = np.arange(len(X)) if order is None else order
    losses, sizes = [], []
    for start in range(0, len(X), batch_size):
        idx = order[start:start + batch_size]
        if zero_grad:
            opt.zero_grad()
        loss = ml.nn.cross_entropy(model(ml.tensor(X[idx])), ml.tensor(y[idx]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
        sizes.append(len(idx))
    if weighted:
        return sum(v * n for v, n in zip(losses, sizes)) / sum(sizes)
    return sum(losses) / len(losses)


def honest_train_epoch(model, opt, X, y, batch_size):
    return _epoch(model, opt, X, y, batch_size)


def test_honest_train_epoch_scores_full_marks():
    for seed in (0, 7):
        result = run_cases("2.1", honest_train_epoch, seed=seed)
        assert result.score == result.max == 5, result.report()


def test_train_epoch_without_zero_grad_fails_the_update():
    result = run_cases("2.1", lambda m, o, X, y, b: _epoch(m, o, X, y, b, zero_grad=False),
                       seed=3)
    _zero_on(result, "one epoch equals step-by-step SGD", "8 epochs of Adam: the loss falls as "
             "it should")


def test_shuffled_batches_fail_the_order():
    def shuffled(model, opt, X, y, batch_size):
        return _epoch(model, opt, X, y, batch_size, order=np.random.default_rng(0).permutation(
            len(X)))

    _zero_on(run_cases("2.1", shuffled, seed=3), "batches in order, each sample once",
             "one epoch equals step-by-step SGD")


def test_sample_weighted_mean_is_not_the_mean_batch_loss():
    result = run_cases("2.1", lambda m, o, X, y, b: _epoch(m, o, X, y, b, weighted=True), seed=3)
    _zero_on(result, "returns the mean batch loss")
    assert "mean over samples" in _feedback(result)


def test_a_hard_coded_mean_loss_fails_on_another_seed():
    from mlsys_lab.grading.exercises.ch02_introduction.ex2_1_train_epoch import _mean_loss_probe

    copied = _mean_loss_probe(honest_train_epoch, seed=1)  # the number a student could copy
    result = run_cases("2.1", lambda *a: copied, seed=2)
    _zero_on(result, "returns the mean batch loss")


def test_the_grader_reference_epoch_is_off_limits():
    from mlsys_lab.grading.exercises.ch02_introduction.ex2_1_train_epoch import _ref_epoch

    result = run_cases("2.1", _ref_epoch, seed=0)
    assert result.score == 0 and "(the grader's own reference) is off limits" in _feedback(result)


# ----------------------------------------------------------------------------- 2.2 evaluate


def _accuracy(model, X, y):
    with ml.no_grad():
        logits = model(ml.tensor(X)).numpy()
    return float(np.mean(np.argmax(logits, axis=1) == y))


def honest_evaluate(model, X, y):
    was_training = model.training
    model.eval()
    try:
        return _accuracy(model, X, y)
    finally:
        model.train(was_training)


def test_honest_evaluate_scores_full_marks():
    result = run_cases("2.2", honest_evaluate, seed=4)
    assert result.score == result.max == 4, result.report()


def test_the_chapter_accuracy_without_eval_mode_fails_dropout():
    result = run_cases("2.2", _accuracy, seed=4)  # chapter 2's accuracy(): no_grad, no eval()
    _zero_on(result, "eval mode for Dropout, mode restored")


def test_restoring_only_the_top_level_flag_leaves_dropout_in_eval_mode():
    def top_flag_only(model, X, y):
        was_training = model.training
        model.eval()
        score = _accuracy(model, X, y)
        model.training = was_training  # the submodules stay in eval mode
        return score

    result = run_cases("2.2", top_flag_only, seed=4)
    _zero_on(result, "eval mode for Dropout, mode restored")
    assert "left in eval mode" in _feedback(result)


def test_evaluate_with_the_tape_on_fails():
    def taped(model, X, y):
        was = model.training
        model.eval()
        score = float(np.mean(np.argmax(model(ml.tensor(X)).numpy(), axis=1) == y))
        model.train(was)
        return score

    _zero_on(run_cases("2.2", taped, seed=4), "no tape, parameters untouched")


def test_the_grader_reference_accuracy_is_off_limits():
    from mlsys_lab.grading.exercises.ch02_introduction.ex2_2_evaluate import _ref_accuracy

    assert run_cases("2.2", _ref_accuracy, seed=0).score == 0


# ----------------------------------------------------------------------------- 2.3 checkpoints
# The answers are module-level functions: 2.3 rebuilds load_checkpoint from its source.


def save_checkpoint(path, model, optimizer):
    ml.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def load_checkpoint(path, model, optimizer):
    ckpt = ml.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])


def test_honest_checkpoint_scores_full_marks():
    result = run_cases("2.3", save_checkpoint, load_checkpoint)
    assert result.score == result.max == 4, result.report()


_STASH = {}


def save_weights_stash_optimiser(path, model, optimizer):
    ml.save(model.state_dict(), path)
    _STASH["optimizer"] = optimizer.state_dict()  # kept in the notebook's memory


def load_weights_and_stash(path, model, optimizer):
    model.load_state_dict(ml.load(path))
    optimizer.load_state_dict(_STASH["optimizer"])


IDEA_CASES = ("the file holds Adam's moments and step count",
              "a fresh process resumes exactly from a copy of the file")


def test_weights_only_with_the_optimiser_in_memory_scores_zero_on_resume():
    """The issue's cheat: it scored 4/4 when the resume ran in the same process."""
    result = run_cases("2.3", save_weights_stash_optimiser, load_weights_and_stash)
    _zero_on(result, *IDEA_CASES)
    points = _points(result)
    assert points["the file is an ml checkpoint of the weights"] == 1  # the weights are there
    assert points["restored model predicts identically"] == 1
    assert "_STASH" in _feedback(result) and "fresh Python process" in _feedback(result)


def _closure_pair():
    stash = {}

    def save(path, model, optimizer):
        ml.save(model.state_dict(), path)
        stash["optimizer"] = optimizer.state_dict()

    def load(path, model, optimizer):
        model.load_state_dict(ml.load(path))
        optimizer.load_state_dict(stash["optimizer"])

    return save, load


def save_next_to_it(path, model, optimizer):
    ml.save(model.state_dict(), path)
    ml.save(optimizer.state_dict(), path + ".optim")  # a second file beside the checkpoint


def load_next_to_it(path, model, optimizer):
    model.load_state_dict(ml.load(path))
    optimizer.load_state_dict(ml.load(path + ".optim"))


SIDE_FILE = os.path.join(tempfile.gettempdir(), f"mlsys_lab_side_{os.getpid()}.npz")


def save_to_a_fixed_side_file(path, model, optimizer):
    ml.save(model.state_dict(), path)
    ml.save(optimizer.state_dict(), SIDE_FILE)  # a file elsewhere: survives the fresh process


def load_from_a_fixed_side_file(path, model, optimizer):
    model.load_state_dict(ml.load(path))
    optimizer.load_state_dict(ml.load(SIDE_FILE))


def save_on_the_library(path, model, optimizer):
    ml.save(model.state_dict(), path)
    ml._optimiser_stash = optimizer.state_dict()  # an attribute of an imported module


def load_from_the_library(path, model, optimizer):
    model.load_state_dict(ml.load(path))
    optimizer.load_state_dict(ml._optimiser_stash)


def load_weights_only(path, model, optimizer):
    model.load_state_dict(ml.load(path)["model"])  # the optimiser is saved but not restored


@pytest.mark.parametrize("pair", [
    _closure_pair(),
    (save_next_to_it, load_next_to_it),
    (save_to_a_fixed_side_file, load_from_a_fixed_side_file),
    (save_on_the_library, load_from_the_library),
], ids=["a closure", "a second file beside it", "a file elsewhere", "a module attribute"])
def test_optimiser_state_outside_the_file_scores_zero_on_resume(pair):
    try:
        result = run_cases("2.3", *pair)
    finally:
        if os.path.exists(SIDE_FILE):
            os.unlink(SIDE_FILE)
        vars(ml).pop("_optimiser_stash", None)
    _zero_on(result, *IDEA_CASES)


def test_an_optimiser_saved_but_not_restored_fails_the_resume():
    result = run_cases("2.3", save_checkpoint, load_weights_only)
    _zero_on(result, "a fresh process resumes exactly from a copy of the file")
    assert "drifts from uninterrupted training" in _feedback(result)


def _notebook(answer: str, path: Path) -> Path:
    nb = nbformat.read(CH02_EXERCISE, as_version=4)
    for cell in nb.cells:
        if "answer:2.3" in cell.metadata.get("tags", []):
            cell.source = answer
    nbformat.write(nb, path)
    return path


STASH_ANSWER = """
_optimiser = {}

def save_checkpoint(path, model, optimizer):
    ml.save(model.state_dict(), path)
    _optimiser["state"] = optimizer.state_dict()

def load_checkpoint(path, model, optimizer):
    model.load_state_dict(ml.load(path))
    optimizer.load_state_dict(_optimiser["state"])
"""

HONEST_ANSWER = """
def _pack(model, optimizer):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

def save_checkpoint(path, model, optimizer):
    ml.save(_pack(model, optimizer), path)

KEYS = ("model", "optimizer")

def load_checkpoint(path, model, optimizer):
    ckpt = ml.load(path)
    model.load_state_dict(ckpt[KEYS[0]])
    optimizer.load_state_dict(ckpt[KEYS[1]])
"""


def test_the_grader_resumes_a_notebook_answer_in_a_fresh_process(tmp_path):
    """Under ``mlsys-lab grade`` the stash lives in the kernel; the fresh process has only the file.
    An honest answer using a helper and a constant from its cell still gets full marks."""
    report = grade(_notebook(STASH_ANSWER, tmp_path / "ch02_stash.ipynb"), cell_timeout=120,
                   timeout=300)
    row = next(r for r in report.rows if r.exercise == "2.3")
    cases = {c["name"]: c["points"] for c in row.cases}
    assert all(cases[name] == 0 for name in IDEA_CASES), report.to_table()
    assert "_optimiser" in row.feedback
    report = grade(_notebook(HONEST_ANSWER, tmp_path / "ch02_honest.ipynb"), cell_timeout=120,
                   timeout=300)
    row = next(r for r in report.rows if r.exercise == "2.3")
    assert row.points == row.max == 4, report.to_table()


def test_the_fresh_process_gets_the_folder_that_holds_the_package():
    """2.3's fresh process puts the folder holding ``mlsys_lab`` on its path, whatever folder the
    check module sits in (three levels up from the old ``grading/ch02.py`` became
    ``mlsys_lab/grading`` when the checks moved into ``exercises/ch02_introduction/``)."""
    from mlsys_lab.grading.exercises.ch02_introduction.ex2_3_checkpoint import _package_root

    root = Path(_package_root())
    assert (root / "mlsys_lab" / "__init__.py").is_file()
    assert root == Path(ml.__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- 3.1 LowRankLinear


class LowRankLinear(ml.nn.Module):
    def __init__(self, in_features, out_features, rank, rng=None):
        if not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"rank must lie in 1..{min(in_features, out_features)}")
        super().__init__()
        rng = np.random.default_rng(rng)
        self.U = ml.nn.Parameter(ml.nn.init.kaiming_uniform((in_features, rank), rng, gain=1.0))
        self.V = ml.nn.Parameter(ml.nn.init.kaiming_uniform((rank, out_features), rng, gain=1.0))
        self.bias = ml.nn.Parameter(ml.nn.init.zeros((out_features,)))

    def forward(self, x):
        return (x @ self.U) @ self.V + self.bias


class LoRAInit(LowRankLinear):
    """LoRA's initialisation: U random, V zero."""

    def __init__(self, in_features, out_features, rank, rng=None):
        super().__init__(in_features, out_features, rank, rng)
        self.V = ml.nn.Parameter(ml.nn.init.zeros((rank, out_features)))


class BothZero(LoRAInit):
    def __init__(self, in_features, out_features, rank, rng=None):
        super().__init__(in_features, out_features, rank, rng)
        self.U = ml.nn.Parameter(ml.nn.init.zeros((in_features, rank)))


def test_lowrank_honest_and_lora_initialisation_score_full_marks():
    """Issue item 4: one zero factor (LoRA) was refused with 'no gradient can ever reach them'."""
    for layer in (LowRankLinear, LoRAInit):
        result = run_cases("3.1", layer, seed=2)
        assert result.score == result.max == 5, result.report()


def test_both_factors_zero_is_refused_with_the_true_reason():
    result = run_cases("3.1", BothZero, seed=2)
    assert _points(result) == {**_points(run_cases("3.1", LowRankLinear, seed=2)),
                               "seeded initialisation that can train": 0}
    text = _feedback(result)
    assert "both start at zero" in text and "LoRA" in text
    assert "no gradient can ever reach" not in text


class WrongForwardWithZeroV(LoRAInit):
    def forward(self, x):
        return ((x @ self.U) @ self.V) * 2.0 + self.bias  # hidden by V = 0 at initialisation


def test_a_zero_factor_cannot_hide_a_wrong_forward():
    _zero_on(run_cases("3.1", WrongForwardWithZeroV, seed=2), "forward equals (x @ U) @ V + bias")


class TransposedFullMatrix(LowRankLinear):
    def forward(self, x):
        return ((self.V.T @ self.U.T) @ x.T).T + self.bias  # the (out, in) matrix, two matmuls


class FullMatrix(LowRankLinear):
    def forward(self, x):
        return x @ (self.U @ self.V) + self.bias


def test_forming_the_full_matrix_in_any_layout_fails():
    for layer in (FullMatrix, TransposedFullMatrix):
        _zero_on(run_cases("3.1", layer, seed=2), "never forms the full in x out matrix")


class PrecomputedWeight(LowRankLinear):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "W", (self.U.numpy() @ self.V.numpy()))

    def forward(self, x):
        return x @ ml.tensor(self.W) + self.bias


def test_a_weight_precomputed_in_init_fails_forward_and_gradients():
    _zero_on(run_cases("3.1", PrecomputedWeight, seed=2), "forward equals (x @ U) @ V + bias",
             "gradients reach U, V and bias")


class GlobalRandom(LowRankLinear):
    def __init__(self, in_features, out_features, rank, rng=None):
        super().__init__(in_features, out_features, rank, rng=None)  # ignores rng


def test_an_initialisation_that_ignores_rng_fails():
    _zero_on(run_cases("3.1", GlobalRandom, seed=2), "seeded initialisation that can train")


class ClampedRank(LowRankLinear):
    """Clamps a bad rank into 1..min(in, out) instead of raising."""

    def __init__(self, in_features, out_features, rank, rng=None):
        super().__init__(in_features, out_features,
                         min(max(rank, 1), in_features, out_features), rng)


def test_a_bad_rank_clamped_instead_of_raising_fails_only_the_error_case():
    result = run_cases("3.1", ClampedRank, seed=2)
    assert _points(result) == {**_points(run_cases("3.1", LowRankLinear, seed=2)),
                               "a bad rank raises ValueError": 0}
    assert "LowRankLinear(8, 6, 7) gave" in _feedback(result)
    assert "raise ValueError" in _feedback(result)


class FromLinear(LowRankLinear):
    def __init__(self, in_features, out_features, rank, rng=None):
        super().__init__(in_features, out_features, rank, rng)
        self.V = ml.nn.Parameter(ml.nn.Linear(rank, out_features, rng=rng).weight.numpy())


def test_ml_nn_linear_is_off_limits_in_the_layer():
    result = run_cases("3.1", FromLinear, seed=2)
    built = [row.name for row in result.rows if row.name != "a bad rank raises ValueError"]
    _zero_on(result, *built)  # every case that builds a layer; a bad rank raises before Linear
    assert "`mlsys_lab.nn.layers.Linear.__init__` is off limits" in _feedback(result)


# ----------------------------------------------------------------------------- 3.2 softplus


def _same_shape(x):
    return AVal(x.shape, x.dtype)


def _sigmoid_vjp(g, inputs, out, needs):
    return (g * ml.ops.sigmoid(inputs[0]),)


def _sigmoid_jvp(tangents, inputs, out):
    return tangents[0] * ml.ops.sigmoid(inputs[0])


def _numpy_vjp(g, inputs, out, needs):
    x = inputs[0].numpy()
    return (ml.tensor(g.numpy() / (1 + np.exp(-x))),)


def _g_ignored_vjp(g, inputs, out, needs):
    return (ml.ops.sigmoid(inputs[0]),)


def _by_ml_vjp(g, inputs, out, needs):
    _, pullback = ml.vjp(lambda t: ml.ops.log(1 + ml.ops.exp(t)), inputs[0])
    return pullback(g)


def _by_backward(g, inputs, out, needs):
    t = ml.tensor(inputs[0].numpy(), requires_grad=True)
    (ml.ops.log(1 + ml.ops.exp(t)) * g).sum().backward()
    return (t.grad,)


def _op(name, vjp=_sigmoid_vjp, jvp=_sigmoid_jvp, compute=lambda x: np.logaddexp(0.0, x)):
    REGISTRY.pop(name, None)
    op = register(Op(name, compute, _same_shape, vjp, jvp, elementwise=True))
    return lambda x: apply(op, x)


def test_honest_softplus_scores_full_marks():
    result = run_cases("3.2", _op("softplus_t_honest"), seed=1)
    assert result.score == result.max == 5, result.report()


RULE_CASES = ("one registered op; rules follow the registry", "your VJP rule, ml.grad and ml.vjp",
              "your JVP rule, ml.jvp, agreement with the VJP",
              "second derivative (rules in ml ops)")


def test_softplus_composed_of_builtin_ops_scores_zero_on_the_rules():
    """It scored 4/5: every derivative case tested the built-ins' rules, not the student's."""
    def composite(x):
        x = ml.tensor(x) if not isinstance(x, ml.Tensor) else x
        return ml.ops.maximum(x, 0.0) + ml.ops.log(1 + ml.ops.exp(-ml.ops.abs(x)))

    _zero_on(run_cases("3.2", composite, seed=1), *RULE_CASES)


@pytest.mark.parametrize("rule", [_by_ml_vjp, _by_backward], ids=["ml.vjp", "backward"])
def test_letting_the_framework_derive_the_rule_is_off_limits(rule):
    result = run_cases("3.2", _op(f"softplus_t_{rule.__name__}", vjp=rule), seed=1)
    _zero_on(result, *RULE_CASES)
    assert "`mlsys_lab.engine.autodiff." in _feedback(result) and "off limits" in _feedback(result)


def test_a_vjp_that_ignores_g_fails():
    _zero_on(run_cases("3.2", _op("softplus_t_no_g", vjp=_g_ignored_vjp), seed=1),
             "your VJP rule, ml.grad and ml.vjp")


def test_a_vjp_in_numpy_fails_the_second_derivative():
    _zero_on(run_cases("3.2", _op("softplus_t_numpy", vjp=_numpy_vjp), seed=1),
             "second derivative (rules in ml ops)")


def test_an_overflowing_kernel_fails_the_stability_case():
    naive = _op("softplus_t_naive", compute=lambda x: np.log(1 + np.exp(x)))
    _zero_on(run_cases("3.2", naive, seed=1), "no overflow at +-800")


# ----------------------------------------------------------------------------- 3.3 functional


def loss_fn(params, X, y):
    return ml.ops.cross_entropy(ml.ops.matmul(X, params["W"]) + params["b"], y)


def sgd_step(params, X, y, lr):
    grads = ml.grad(loss_fn)(params, X, y)
    return {k: params[k] - lr * grads[k].numpy() for k in params}


def test_honest_functional_answers_score_full_marks():
    result = run_cases("3.3", loss_fn, sgd_step, seed=6)
    assert result.score == result.max == 4, result.report()


def test_an_sgd_step_with_hidden_momentum_fails_purity_and_the_run():
    velocity = {}

    def momentum_step(params, X, y, lr):
        grads = ml.grad(loss_fn)(params, X, y)
        for k in params:
            velocity[k] = 0.9 * velocity.get(k, 0.0) + grads[k].numpy()
        return {k: params[k] - lr * velocity[k] for k in params}

    _zero_on(run_cases("3.3", loss_fn, momentum_step, seed=6), "sgd_step is pure and correct",
             "40 steps equal plain gradient descent")


def test_an_in_place_sgd_step_fails_purity():
    def in_place(params, X, y, lr):
        grads = ml.grad(loss_fn)(params, X, y)
        for k in params:
            params[k] -= lr * grads[k].numpy()
        return params

    _zero_on(run_cases("3.3", loss_fn, in_place, seed=6), "sgd_step is pure and correct")


def test_the_library_optimiser_is_off_limits_in_sgd_step():
    def via_optimiser(params, X, y, lr):
        ps = {k: ml.nn.Parameter(np.array(v, copy=True)) for k, v in params.items()}
        loss_fn(ps, X, y).backward()
        ml.optim.SGD(list(ps.values()), lr=lr).step()
        return {k: p.numpy() for k, p in ps.items()}

    result = run_cases("3.3", loss_fn, via_optimiser, seed=6)
    _zero_on(result, "sgd_step is pure and correct", "40 steps equal plain gradient descent")
    assert "`mlsys_lab.optim.optimizers." in _feedback(result)

    def via_fused_update(params, X, y, lr):  # the optimiser's kernel, on copies (still pure)
        from mlsys_lab.kernels.optim import sgd_dense

        grads = ml.grad(loss_fn)(params, X, y)
        return {k: sgd_dense(np.array(v, copy=True), np.asarray(grads[k]), lr)
                for k, v in params.items()}

    result = run_cases("3.3", loss_fn, via_fused_update, seed=6)
    _zero_on(result, "sgd_step is pure and correct", "40 steps equal plain gradient descent")
    assert "`mlsys_lab.kernels.optim." in _feedback(result)


def test_a_numpy_loss_gives_no_gradient():
    def numpy_loss(params, X, y):
        z = X @ np.asarray(params["W"]) + np.asarray(params["b"])
        z = z - z.max(axis=1, keepdims=True)
        return float(-(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(axis=1))).mean())

    result = run_cases("3.3", numpy_loss, sgd_step, seed=6)
    assert _points(result)["loss value on 3 problems"] == 1
    _zero_on(result, "ml.grad(loss_fn) on 3 problems")


def test_the_grader_references_for_3_3_are_off_limits():
    from mlsys_lab.grading.exercises.ch03_programming_interface.ex3_3_functional import (
        _ref_loss_grad,
    )

    def via_reference(params, X, y, lr):
        _, g = _ref_loss_grad(params, X, y)
        return {k: params[k] - lr * g[k] for k in params}

    result = run_cases("3.3", loss_fn, via_reference, seed=6)
    _zero_on(result, "sgd_step is pure and correct", "40 steps equal plain gradient descent")
    assert "ex3_3_functional._ref_loss_grad` (the grader's own reference)" in _feedback(result)
