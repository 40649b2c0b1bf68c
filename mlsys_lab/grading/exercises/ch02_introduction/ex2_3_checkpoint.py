"""Exercise 2.3: a checkpoint that restores the model *and* the optimiser, so training resumes
exactly — from the file alone, in a fresh process.

Wrong ideas rejected: a weights-only file restores predictions but not Adam's moments and step
count, so a resumed run drifts; keeping the optimiser's state in the notebook's memory (a global
dict, a closure) or in a second file next to the checkpoint works inside one process, but the
check copies the one file to a new folder, deletes the original and resumes in a fresh Python
process, where only the file exists; state kept in a file elsewhere fails because the judge reads
the checkpoint itself and looks for the moments and the step count in it; and a restored model
that shares arrays with the original shows when one of them is changed.

Nothing is forbidden by name: ``ml.save``/``ml.load`` and the ``state_dict`` methods are the
tools the exercise teaches. The probes may use files and folders (``allowed`` adds ``os``,
``pathlib``, ``tempfile``, ``shutil``): an answer may make the checkpoint's folder or write
atomically.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types

import numpy as np

from mlsys_lab.grading.core.exercise import DEFAULT_ALLOWED, Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch02_introduction.common import (
    batch_loss,
    blobs,
    mlp,
    param_arrays,
)

_STEPS = 3  # Adam steps before the checkpoint (the step count the file must hold)


def _train_steps(model, opt, steps, seed):
    """``steps`` Adam steps on batches of 8 from a seeded set of 24; returns the losses."""
    X, y = blobs(seed, n=24)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        sl = slice((i * 8) % 24, (i * 8) % 24 + 8)
        loss = batch_loss(model, X[sl], y[sl])
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


def _trained():
    """The model and optimiser every 2.3 case checkpoints: an MLP after 3 Adam steps."""
    import mlsys_lab as ml

    model = mlp(70)
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
    fresh = mlp(99)
    fresh_opt = ml.optim.Adam(fresh.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ckpt.npz")
        save_checkpoint(path, model, opt)
        load_checkpoint(path, fresh, fresh_opt)
    with ml.no_grad():
        predictions = np.array(fresh(ml.tensor(blobs(62, n=20)[0])).numpy(), copy=True)
    fresh.parameters()[0].data[...] = 0.0
    return {"predictions": predictions, "original": model.parameters()[0].numpy().copy()}


def _predict_judge(raw):
    import mlsys_lab as ml

    model, _ = _trained()
    with ml.no_grad():
        expected = model(ml.tensor(blobs(62, n=20)[0])).numpy()
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


def _package_root() -> str:
    """The folder that holds the ``mlsys_lab`` package, for the fresh process's ``sys.path``
    (this file is ``mlsys_lab/grading/exercises/ch02_introduction/ex2_3_checkpoint.py``)."""
    path = os.path.abspath(__file__)
    for _ in range(5):
        path = os.path.dirname(path)
    return path


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
    package_root = _package_root()
    command = ("import sys; sys.path.insert(0, sys.argv[2]); "
               "from mlsys_lab.grading.exercises.ch02_introduction.ex2_3_checkpoint "
               "import _fresh_resume_main; "
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
        model = mlp(72)
        opt = ml.optim.Adam(model.parameters(), lr=0.01)
        namespace[job["name"]](job["path"], model, opt)
        result["losses"] = _train_steps(model, opt, 3, 73)
        result["params"] = {k: v.tolist() for k, v in param_arrays(model).items()}
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
        id="2.3",
        title="Checkpoint and resume",
        target=("save_checkpoint", "load_checkpoint"),
        task="the checkpoint",
        forbidden=(),  # ml.save/ml.load are the tools taught
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
