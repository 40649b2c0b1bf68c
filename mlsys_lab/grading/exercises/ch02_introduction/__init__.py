"""Checks for chapter 2, the introduction (``solutions/ch02_introduction.ipynb``).

The end-to-end job of a framework, one piece per exercise: 2.1 one training epoch over
mini-batches, 2.2 evaluation (accuracy in eval mode, without the tape), 2.3 a checkpoint that
restores the model *and* the optimiser so training resumes exactly — from the file alone, in a
fresh process. Every model and data set here is small, synthetic and seeded.

The library has no training loop, accuracy or checkpoint helper that would do these exercises
(``ml.save``/``ml.load`` and the ``state_dict`` methods are the tools they teach), so nothing is
forbidden by name; the references in this module (``_ref_epoch``, ``_ref_accuracy``) are off
limits to the student's code automatically.
"""

from __future__ import annotations

import importlib
import inspect
import json
import numbers
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types

import numpy as np

from mlsys_lab.grading.core.exercise import (
    DEFAULT_ALLOWED,
    Case,
    Exercise,
    Opaque,
    describe,
    register,
)

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


def _params(model) -> dict:
    """Copies of the model's parameters by name."""
    return {name: p.numpy().copy() for name, p in model.named_parameters()}


def _batch_loss(model, xb, yb):
    import mlsys_lab as ml

    return ml.nn.cross_entropy(model(ml.tensor(xb)), ml.tensor(yb))


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
            self.grad_modes.append(bool(ml.is_grad_enabled()))
            return self.inner(x)

    return Spy


# ----------------------------------------------------------------------------- judge helpers


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


def _as_float(value, what):
    if isinstance(value, Opaque) and value.type_name in ("Tensor", "Parameter"):
        raise AssertionError(
            f"{what} returned a Tensor; return a Python float (loss.item() or float(loss.numpy()))"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AssertionError(f"{what} returned {describe(value)}, expected a float")
    return float(value)


def _expect_params(raw, model, what) -> dict:
    """``raw`` as {name: array} with the names and shapes of ``model``'s parameters."""
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if not isinstance(raw, dict) or set(raw) != set(expected):
        raise AssertionError(f"{what}: the model's parameters changed names (got {describe(raw)})")
    for name, shape in expected.items():
        if not isinstance(raw[name], np.ndarray) or raw[name].shape != shape:
            raise AssertionError(f"{what}: parameter {name} is no longer an array of {shape}")
    return raw


# ----------------------------------------------------------------------------- 2.1 train_epoch
# A wrong idea that still produces plausible output would fail because: no zero_grad (or one per
# epoch) accumulates gradients and zero_grad between backward and step loses them, so the weights
# after one epoch of SGD with momentum differ from the step-by-step reference; shuffling or
# dropping the short last batch shows in the rows the model sees; the sample-weighted mean, the
# last batch's loss or a final full-data loss differ from the mean of the batch losses (the last
# batch has 2 rows, not 16); and every dataset is drawn from the seed, so no number can be copied.

_N, _BATCH = 50, 16  # batches of 16, 16, 16 and 2


def _sgd_epoch_probe(train_epoch, seed):
    import mlsys_lab as ml

    X, y = _blobs(seed + 1, n=_N)
    model = _mlp(7)
    train_epoch(model, ml.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), X, y, _BATCH)
    return _params(model)


def _sgd_epoch_judge(raw, seed):
    import mlsys_lab as ml

    X, y = _blobs(seed + 1, n=_N)
    ref = _mlp(7)
    _ref_epoch(ref, ml.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), X, y, _BATCH)
    start = _params(_mlp(7))
    got = _expect_params(raw, ref, "train_epoch")
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

    X, y = _blobs(seed + 2, n=_N)
    X[:, 0] = np.arange(_N)  # every row is unique
    spy = _spy_class()(_mlp(3))
    train_epoch(spy, ml.optim.SGD(spy.parameters(), lr=0.0), X, y, _BATCH)
    return spy.seen


def _batches_judge(raw, seed):
    X, _ = _blobs(seed + 2, n=_N)
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

    X, y = _blobs(seed + 3, n=_N)
    model = _mlp(5)
    return train_epoch(model, ml.optim.SGD(model.parameters(), lr=0.0), X, y, _BATCH)


def _mean_loss_judge(raw, seed):
    import mlsys_lab as ml

    X, y = _blobs(seed + 3, n=_N)
    got = _as_float(raw, "train_epoch")
    model = _mlp(5)
    expected = _ref_epoch(model, ml.optim.SGD(model.parameters(), lr=0.0), X, y, _BATCH)
    if not np.isclose(got, expected, rtol=1e-5):
        per_sample = float(_batch_loss(model, X, y).numpy())
        hint = (" (that is the mean over samples; average the 4 batch losses instead)"
                if np.isclose(got, per_sample, rtol=1e-5) else "")
        raise AssertionError(
            f"with lr=0 train_epoch returned {got:.6f}{hint}; the mean of the 4 batch losses "
            f"is {expected:.6f}"
        )


def _adam_losses(X, y, train):
    import mlsys_lab as ml

    model = _mlp(11)
    opt = ml.optim.Adam(model.parameters(), lr=0.02)
    return [train(model, opt, X, y, 15) for _ in range(8)]


def _learns_probe(train_epoch, seed):
    return _adam_losses(*_blobs(seed + 4, n=90), train_epoch)


def _learns_judge(raw, seed):
    expected = _adam_losses(*_blobs(seed + 4, n=90), _ref_epoch)
    if not isinstance(raw, list) or len(raw) != 8:
        raise AssertionError(f"8 calls of train_epoch returned {describe(raw)}")
    got = [_as_float(v, "train_epoch") for v in raw]
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-6):
        shown = ", ".join(f"{v:.3f}" for v in got)
        want = ", ".join(f"{v:.3f}" for v in expected)
        raise AssertionError(
            f"over 8 epochs with Adam (lr 0.02, batch_size 15) the mean loss went {shown}; "
            f"step-by-step training gives {want}"
        )


# ----------------------------------------------------------------------------- 2.2 evaluate
# A wrong idea that still produces plausible output would fail because: argmax over the wrong
# axis, a percentage or a count differ from the reference on five seeded models; forgetting
# model.eval() leaves Dropout on (the score changes from call to call and differs from eval mode);
# setting `model.training = False` by hand leaves the Dropout submodule training; always calling
# model.train() afterwards (instead of restoring the mode it came in) shows on a model that came
# in eval mode; and forgetting ml.no_grad() shows in the grad mode the model ran under.


def _random_models_probe(evaluate, seed):
    return [evaluate(_mlp(30 + i), *_blobs(seed * 5 + 20 + i, n=40 + 7 * i)) for i in range(5)]


def _random_models_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 5:
        raise AssertionError(f"evaluate on 5 models returned {describe(raw)}")
    for i, value in enumerate(raw):
        X, y = _blobs(seed * 5 + 20 + i, n=40 + 7 * i)
        got = _as_float(value, "evaluate")
        expected = _ref_accuracy(_mlp(30 + i), X, y)
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
    right, wrong = (_as_float(v, "evaluate") for v in raw)
    if right != 1.0:
        raise AssertionError(f"an identity model on its own one-hot rows scored {right!r}, "
                             f"expected 1.0")
    if wrong != 0.0:
        raise AssertionError(f"with every label wrong it scored {wrong!r}, expected 0.0")


def _dropout_probe(evaluate, seed):
    X, y = _blobs(seed + 40, n=200)
    model = _mlp(41, dropout=0.5)
    model.train()
    scores = [evaluate(model, X, y) for _ in range(3)]
    after_train = [m.training for m in model.modules()]
    model.eval()
    evaluate(model, X, y)
    return {"scores": scores, "after_train": after_train,
            "after_eval": [m.training for m in model.modules()]}


def _dropout_judge(raw, seed):
    X, y = _blobs(seed + 40, n=200)
    expected = _ref_accuracy(_mlp(41, dropout=0.5), X, y)
    if not isinstance(raw, dict) or not isinstance(raw.get("scores"), list):
        raise AssertionError(f"the check got {describe(raw)}")
    got = [_as_float(v, "evaluate") for v in raw["scores"]]
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
    spy = _spy_class()(_mlp(51))
    evaluate(spy, *_blobs(seed + 50, n=30))
    return {"grad_modes": spy.grad_modes, "params": _params(spy)}


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
    spy = _spy_class()(_mlp(51))
    got = _expect_params(raw.get("params"), spy, "evaluate")
    if any(not np.array_equal(got[name], p.numpy()) for name, p in spy.named_parameters()):
        raise AssertionError("evaluate changed the model's parameters")


# ----------------------------------------------------------------------------- 2.3 checkpoints
# A wrong idea that still produces plausible output would fail because: a weights-only file
# restores predictions but not Adam's moments and step count, so a resumed run drifts; keeping the
# optimiser's state in the notebook's memory (a global dict, a closure) or in a second file next
# to the checkpoint works inside one process, but the check copies the one file to a new folder,
# deletes the original and resumes in a fresh Python process, where only the file exists; state
# kept in a file elsewhere fails because the judge reads the checkpoint itself and looks for the
# moments and the step count in it; and a restored model that shares arrays with the original
# shows when one of them is changed.

_STEPS = 3  # Adam steps before the checkpoint (the step count the file must hold)


def _train_steps(model, opt, steps, seed):
    """``steps`` Adam steps on batches of 8 from a seeded set of 24; returns the losses."""
    X, y = _blobs(seed, n=24)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        sl = slice((i * 8) % 24, (i * 8) % 24 + 8)
        loss = _batch_loss(model, X[sl], y[sl])
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


def _trained():
    """The model and optimiser every 2.3 case checkpoints: an MLP after 3 Adam steps."""
    import mlsys_lab as ml

    model = _mlp(70)
    opt = ml.optim.Adam(model.parameters(), lr=0.01)
    _train_steps(model, opt, _STEPS, 71)
    return model, opt


def _saved_file(save_checkpoint):
    """Save the trained model with the student's function; the file's bytes (None: no file)."""
    model, opt = _trained()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        save_checkpoint(path, model, opt)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()


def _file_probe(save_checkpoint, load_checkpoint):
    return _saved_file(save_checkpoint)


def _read_checkpoint(raw) -> dict:
    """Judge side: the student's file, read with ``ml.load`` in this process."""
    import mlsys_lab as ml

    if raw is None:
        raise AssertionError("save_checkpoint(path, ...) wrote no file at path")
    if not isinstance(raw, bytes):
        raise AssertionError(f"the check got {describe(raw)} instead of the file")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        with open(path, "wb") as f:
            f.write(raw)
        try:
            return ml.load(path)
        except ml.CheckpointError as error:
            raise AssertionError(
                f"ml.load cannot read the file: {error}; write it with ml.save"
            ) from None


def _leaves(obj):
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _leaves(value)
    else:
        yield obj


def _holds(stored: dict, array: np.ndarray) -> bool:
    return any(isinstance(a, np.ndarray) and a.shape == array.shape
               and np.allclose(a, array, rtol=1e-6, atol=1e-12) for a in _leaves(stored))


def _file_judge(raw):
    stored = _read_checkpoint(raw)
    model, _ = _trained()
    for name, p in model.named_parameters():
        if not _holds(stored, p.numpy()):
            raise AssertionError(
                f"the checkpoint does not hold parameter {name}; save model.state_dict()"
            )


def _predict_probe(save_checkpoint, load_checkpoint):
    import mlsys_lab as ml

    model, opt = _trained()
    fresh = _mlp(99)
    fresh_opt = ml.optim.Adam(fresh.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        save_checkpoint(path, model, opt)
        load_checkpoint(path, fresh, fresh_opt)
    with ml.no_grad():
        predictions = np.array(fresh(ml.tensor(_blobs(62, n=20)[0])).numpy(), copy=True)
    fresh.parameters()[0].data[...] = 0.0
    return {"predictions": predictions, "original": model.parameters()[0].numpy().copy()}


def _predict_judge(raw):
    import mlsys_lab as ml

    model, _ = _trained()
    with ml.no_grad():
        expected = model(ml.tensor(_blobs(62, n=20)[0])).numpy()
    got = raw.get("predictions") if isinstance(raw, dict) else None
    if not isinstance(got, np.ndarray) or not np.array_equal(got, expected):
        raise AssertionError(
            "a fresh model loaded from the checkpoint predicts differently from the saved one"
        )
    if not np.array_equal(raw.get("original"), model.parameters()[0].numpy()):
        raise AssertionError("the restored model shares arrays with the original")


def _optimiser_state_problem(stored: dict) -> str | None:
    """Why the stored checkpoint lacks Adam's state after ``_trained()`` (None: it has it)."""
    _, opt = _trained()
    for i, state in enumerate(opt.state):
        for key in ("m", "v"):
            if not _holds(stored, state[key]):
                return f"the checkpoint does not hold Adam's moment {key} of parameter {i}"
    steps = [v for v in _leaves(stored) if not isinstance(v, (str, bool, type(None)))
             and np.size(v) == 1 and np.asarray(v).dtype.kind in "iuf"
             and float(np.asarray(v).reshape(())) == _STEPS]
    if not steps:
        return (f"the checkpoint does not hold the optimiser's step count ({_STEPS}), which "
                f"Adam's bias correction needs")
    return None


def _state_judge(raw):
    problem = _optimiser_state_problem(_read_checkpoint(raw))
    if problem:
        raise AssertionError(f"{problem}; save optimizer.state_dict() in the same file as the "
                             f"model's state")


# The fresh-process resume. The probe saves with the student's save_checkpoint, copies the one
# file into a new folder, deletes the original folder, and runs the student's load_checkpoint
# (rebuilt from its source: imports, plain constants and the functions of the notebook it uses,
# never objects from the notebook's memory) in a new interpreter with a minimal environment, which
# then trains 3 more steps. The judge compares those steps with uninterrupted training.

_ENV_KEEP = ("PATH", "PYTHONPATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TEMP",
             "TMP", "SYSTEMROOT", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
             "NUMBA_CACHE_DIR", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_FRESH_TIMEOUT = 30


def _plain(value, depth: int = 0) -> bool:
    """Data that ``repr`` rebuilds exactly: numbers, strings and small containers of them."""
    if type(value) in _PLAIN:
        return not isinstance(value, float) or np.isfinite(value)
    if type(value) in (tuple, list, set, frozenset) and depth < 4 and len(value) <= 256:
        return all(_plain(v, depth + 1) for v in value)
    if type(value) is dict and depth < 4 and len(value) <= 256:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _import_line(name: str, value) -> str | None:
    """``name = <value, imported by name>`` for a module, or an importable class or function."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None
    if "<" in qualname:
        return None
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # not importable by that name
        return None
    if found is not value:
        return None
    return f"{name} = __import__('importlib').import_module({module!r}).{qualname}"


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _portable_source(fn) -> tuple[str, list[tuple[str, str]]]:
    """Source that rebuilds ``fn`` in a fresh interpreter, and the (name, type) of what it had to
    leave behind.

    Carried over: imports of the modules, classes and functions ``fn`` uses, plain constants,
    and the source of every function of ``fn``'s own namespace it uses (recursively). Anything
    else — a dict of arrays, an optimiser object — lives only in this process's memory and is
    left out, as a fresh process would not have it.

    Raises:
        TypeError, OSError: ``fn`` is not a function whose source can be read.
    """
    home = fn.__globals__
    header, bodies, aliases, missing = [], [], [], []
    todo, done, named = [fn], set(), set()
    while todo:
        f = todo.pop()
        if id(f) in done:
            continue
        done.add(id(f))
        bodies.append(textwrap.dedent(inspect.getsource(f)))
        scope = {n: f.__globals__[n] for n in _code_names(f.__code__) if n in f.__globals__}
        cells = zip(f.__code__.co_freevars, f.__closure__ or ())
        scope.update((n, c.cell_contents) for n, c in cells if _cell_filled(c))
        for name, value in sorted(scope.items()):
            if name in named:
                continue
            named.add(name)
            if (isinstance(value, types.FunctionType) and value.__globals__ is home
                    and value.__name__ != "<lambda>"):
                todo.append(value)
                if name != value.__name__:
                    aliases.append(f"{name} = {value.__name__}")
                continue
            line = _import_line(name, value) or (f"{name} = {value!r}" if _plain(value) else None)
            if line is None:
                missing.append((name, type(value).__name__))
            else:
                header.append(line)
    return "\n".join(header + [""] + bodies[::-1] + aliases) + "\n", missing


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises ValueError for an empty cell
    except ValueError:
        return False
    return True


def _fresh_env(package_root: str) -> dict:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _fresh_resume_probe(save_checkpoint, load_checkpoint):
    model, opt = _trained()
    out = {"file": None, "source_error": None, "left_out": [], "result": None}
    with tempfile.TemporaryDirectory() as fresh:
        moved = os.path.join(fresh, "moved.npz")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "ckpt.npz")
            save_checkpoint(path, model, opt)
            if not os.path.isfile(path):
                return out
            shutil.copyfile(path, moved)
        with open(moved, "rb") as f:
            out["file"] = f.read()
        try:  # after the save, so whatever it left in memory is seen (and left out)
            if getattr(load_checkpoint, "__name__", "<lambda>") == "<lambda>":
                raise TypeError("it is not a function defined with def")
            source, out["left_out"] = _portable_source(load_checkpoint)
        except (TypeError, OSError) as error:
            out["source_error"] = f"{type(error).__name__}: {error}"
            return out
        out["result"] = _run_fresh(fresh, source, load_checkpoint.__name__, moved)
    return out


def _run_fresh(folder: str, source: str, name: str, checkpoint: str) -> dict:
    """Run ``_fresh_resume_main`` in a new interpreter on ``folder``; what it reported."""
    with open(os.path.join(folder, "answer.py"), "w", encoding="utf-8") as f:
        f.write(source)
    with open(os.path.join(folder, "job.json"), "w", encoding="utf-8") as f:
        json.dump({"name": name, "path": checkpoint}, f)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = ("import sys; sys.path.insert(0, sys.argv[2]); "
               "from mlsys_lab.grading.exercises.ch02_introduction import _fresh_resume_main; "
               "_fresh_resume_main(sys.argv[1])")
    try:
        done = subprocess.run([sys.executable, "-c", command, folder, package_root], cwd=folder,
                              env=_fresh_env(package_root), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=_FRESH_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"it did not finish within {_FRESH_TIMEOUT} s"}
    result_file = os.path.join(folder, "result.json")
    if os.path.isfile(result_file):
        with open(result_file, encoding="utf-8") as f:
            return json.load(f)
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return {"error": f"the process exited with code {done.returncode} {tail[0][:300]}".strip()}


def _fresh_resume_main(folder: str) -> None:
    """In the fresh interpreter: rebuild load_checkpoint, restore, train 3 steps, write results."""
    import mlsys_lab as ml

    result = {"error": None}
    filename = os.path.join(folder, "answer.py")
    try:
        with open(os.path.join(folder, "job.json"), encoding="utf-8") as f:
            job = json.load(f)
        with open(filename, encoding="utf-8") as f:
            namespace = {"__name__": "__answer__"}
            exec(compile(f.read(), filename, "exec"), namespace)
        model = _mlp(72)
        opt = ml.optim.Adam(model.parameters(), lr=0.01)
        namespace[job["name"]](job["path"], model, opt)
        result["losses"] = _train_steps(model, opt, 3, 73)
        result["params"] = {k: v.tolist() for k, v in _params(model).items()}
    except BaseException as error:  # the student's code failed: report it, never crash
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        where = [fr.name for fr in __import__("traceback").extract_tb(error.__traceback__)
                 if fr.filename == filename]
        result["error"] = (f"{type(error).__name__}{': ' + text if text else ''}"
                           f"{' (in ' + where[-1] + ')' if where else ''}")
    with open(os.path.join(folder, "result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


def _fresh_resume_judge(raw):
    if not isinstance(raw, dict):
        raise AssertionError(f"the check got {describe(raw)}")
    stored = _read_checkpoint(raw.get("file"))
    if raw.get("source_error"):
        raise AssertionError(
            f"the check resumes from your file in a fresh Python process, which needs the "
            f"source of load_checkpoint, and could not read it ({raw['source_error']}); define "
            f"it with `def load_checkpoint(path, model, optimizer):` in a notebook cell"
        )
    result = raw.get("result") if isinstance(raw.get("result"), dict) else {}
    if result.get("error") or "params" not in result:
        error = str(result.get("error") or "no result")
        left_out = [f"`{name}` (a {kind})" for name, kind in raw.get("left_out") or ()
                    if str(name) in error]
        memory = (f" A fresh process has only the file: {', '.join(left_out)} from your "
                  f"notebook's memory is not there." if left_out else "")
        raise AssertionError(
            f"in a fresh Python process, load_checkpoint on a copy of your checkpoint failed: "
            f"{error}.{memory} Put everything needed to resume — "
            f"the model's and the optimiser's state — in the one file at path"
        )
    model, opt = _trained()
    expected_losses = _train_steps(model, opt, 3, 73)  # training that never stopped
    got = result["params"] if isinstance(result["params"], dict) else {}
    losses = result.get("losses")
    same = isinstance(losses, list) and np.allclose(losses, expected_losses, rtol=1e-6,
                                                    atol=1e-7)
    same = same and all(
        name in got and np.shape(got[name]) == p.shape
        and np.allclose(np.asarray(got[name], dtype=np.float64), p.numpy(), rtol=1e-6, atol=1e-7)
        for name, p in model.named_parameters()
    )
    if not same:
        raise AssertionError(
            "training resumed in a fresh process from a copy of the checkpoint drifts from "
            "uninterrupted training; save and restore the optimiser too (optimizer.state_dict(): "
            "Adam's moments and step count)"
        )
    problem = _optimiser_state_problem(stored)
    if problem:
        raise AssertionError(
            f"the resumed run matches, but {problem.replace('the checkpoint', 'your file', 1)}: "
            f"the optimiser's state came from somewhere else (a second file?), and a checkpoint "
            f"is one file that holds it all"
        )


register(
    Exercise(
        id="2.1",
        title="One training epoch",
        target="train_epoch",
        task="the training loop",
        forbidden=(),  # no library function trains an epoch; see the module docstring
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
    Exercise(
        id="2.2",
        title="Evaluate accuracy",
        target="evaluate",
        task="the evaluation",
        forbidden=(),  # no library function computes accuracy; see the module docstring
        cases=(
            Case("5 random models", 1.5, probe=_random_models_probe, judge=_random_models_judge),
            Case("all right = 1.0, all wrong = 0.0", 0.5,
                 probe=_extremes_probe, judge=_extremes_judge),
            Case("eval mode for Dropout, mode restored", 1,
                 probe=_dropout_probe, judge=_dropout_judge),
            Case("no tape, parameters untouched", 1, probe=_no_tape_probe, judge=_no_tape_judge),
        ),
    ),
    Exercise(
        id="2.3",
        title="Checkpoint and resume",
        target=("save_checkpoint", "load_checkpoint"),
        task="the checkpoint",
        forbidden=(),  # ml.save/ml.load are the tools taught; see the module docstring
        # files and folders: an answer may make the checkpoint's folder or write atomically
        allowed=DEFAULT_ALLOWED + ("os", "posix", "posixpath", "ntpath", "genericpath", "stat",
                                   "pathlib", "tempfile", "shutil"),
        cases=(
            Case("the file is an ml checkpoint of the weights", 1,
                 probe=_file_probe, judge=_file_judge),
            Case("restored model predicts identically", 1,
                 probe=_predict_probe, judge=_predict_judge),
            Case("the file holds Adam's moments and step count", 0.5,
                 probe=_file_probe, judge=_state_judge),
            Case("a fresh process resumes exactly from a copy of the file", 1.5,
                 probe=_fresh_resume_probe, judge=_fresh_resume_judge),
        ),
    ),
)
