"""Cheats built from the function that solves an exercise, for the integrity tests.

``CHEATS[ex_id](transform)`` returns the exercise's answer(s), in the order of its targets,
built from a library function or the grader's own reference that does the work, with
``transform`` applied to that function: the identity (the answers then pass the cases that
test the idea when the guard is off), ``_clone`` (H1: its code claiming a file of the
installed Python) or ``_paste_padded`` (H2: its source pasted with a no-op line). The small
wrappers around it adapt signatures only: the work is the forbidden function's.
"""

from __future__ import annotations

import types

import numpy as np

import mlsys_lab as ml


def _softmax_loss(params, X, y):
    logits = ml.ops.matmul(X, params["W"]) + params["b"]
    return ml.ops.cross_entropy(logits, y)


def _train_epoch_answers(transform):
    from mlsys_lab.grading.exercises.ch02_introduction import ex2_1_train_epoch as ch02
    return (transform(ch02._ref_epoch),)


def _functional_answers(transform):
    """3.3: the reference's loss gradient inside a hand-written step."""
    from mlsys_lab.grading.exercises.ch03_programming_interface import ex3_3_functional as ch03
    ref = transform(ch03._ref_loss_grad)

    def sgd_step(params, X, y, lr):
        _, g = ref(params, X, y)
        return {k: params[k] - lr * g[k] for k in params}
    return (_softmax_loss, sgd_step)


def _roofline_answers(transform):
    from mlsys_lab.kernels import roofline
    return (transform(roofline.tile_intensity),
            lambda m, n, k, dtype_bytes: (m * k + k * n + m * n) * dtype_bytes,
            transform(roofline.attainable))


def _speculative_answers(transform):
    from mlsys_lab.llm import speculative
    res = transform(speculative.residual)

    def speculative_verify(p, q, draft, u, sample):
        for i, x in enumerate(draft):
            if u[i] >= min(1.0, p[i][x] / q[i][x]):
                return list(draft[:i]) + [sample(res(p[i], q[i]))]
        return list(draft) + [sample(p[len(draft)])]
    return (speculative_verify,)


def _library(module: str, path: str):
    """A builder whose answer is the function at ``module``'s ``path`` itself, transformed."""
    def build(transform):
        import importlib
        fn = importlib.import_module(module)
        for name in path.split("."):
            fn = getattr(fn, name)
        return (transform(fn),)
    return build


def _grading_module(ex_id: str):
    """The exercise module of ``ex_id`` (``"15.2"`` -> ``ch15_.../ex15_2_gae.py``)."""
    import importlib
    import pkgutil

    from mlsys_lab.grading import exercises
    package = importlib.import_module(exercises.package_of(int(ex_id.split(".")[0])))
    prefix = f"ex{ex_id.replace('.', '_')}_"
    [name] = [m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith(prefix)]
    return importlib.import_module(f"{package.__name__}.{name}")


def _reference_of(ex_id, transform, adapt=None):
    """The grading module's private ``_reference`` for ``ex_id``, transformed, as the answer
    (``adapt`` wraps it where the answer's signature differs)."""
    ref = transform(_grading_module(ex_id)._reference)
    return (ref if adapt is None else adapt(ref),)


def _shapley_answers(transform):
    from mlsys_lab.explain import shapley
    kernel = transform(shapley.shapley_kernel)
    exact = transform(_grading_module("16.2")._shapley)
    return (kernel, exact)


def _grad_cam_answers(transform):
    from mlsys_lab.explain import cam
    explain = transform(cam.grad_cam)
    return (lambda model, x, target, layer: explain(model, x, target, layer).attributions,)


def _psi_answers(transform):
    from mlsys_lab.federated.crypto import psi, rsa
    blind, unblind = transform(psi.blind), transform(psi.unblind)

    def blind_psi(items, n, e, published, sign_blinded, H, H_prime, rng):
        key = rsa.RSAPublicKey(n, e)
        rs = [rng.randrange(2, n - 1) for _ in items]
        signed = sign_blinded([blind(H(b), r, key) for b, r in zip(items, rs)])
        return [b for b, s, r in zip(items, signed, rs) if H_prime(unblind(s, r, key)) in published]
    return (blind_psi,)


def _ig_answers(transform):
    from mlsys_lab.explain import gradients
    rule = transform(gradients.path_rule)

    def integrated_gradients(grad_f, x, baseline, steps):
        alphas, weights = rule(steps, "riemann_middle")
        path = baseline + alphas.reshape((-1,) + (1,) * x.ndim) * (x - baseline)
        return (x - baseline) * np.tensordot(weights, grad_f(path), axes=1)
    return (integrated_gradients,)


def _astar_answers(transform):
    from mlsys_lab.robotics import planning
    plan = transform(planning.astar)

    def astar(grid, start, goal, neighbors):
        result = plan(grid, start, goal)
        for cell in result.order:       # the expansions, shown where the probe counts them
            neighbors(cell)
        return result.path
    return (astar,)


def _transform_class(cls, transform):
    """A copy of ``cls`` whose every function has gone through ``transform``."""
    namespace = {k: transform(v) if isinstance(v, types.FunctionType) else v
                 for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return type(cls.__name__, cls.__bases__, namespace)


def _replay_answers(transform):
    from mlsys_lab.rl.agents import replay
    library = _transform_class(replay.ReplayBuffer, transform)

    class ReplayBuffer:
        def __init__(self, capacity, obs_dim):
            self.inner = library(capacity, (obs_dim,), obs_dtype=np.float64)

        def __len__(self):
            return len(self.inner)

        def add(self, obs, action, reward, next_obs, terminated):
            self.inner.add(obs, action, reward, next_obs, terminated)

        def sample(self, batch_size, rng):
            self.inner.rng = rng
            d = self.inner.sample(batch_size)
            return d["obs"], d["actions"], d["rewards"], d["next_obs"], d["terminated"]
    return (ReplayBuffer,)


def _keep_last_answers(transform):
    """17.3 through the runtime's ``Subscription``: its ``__init__`` (the depth check) and its
    ``offer`` (KEEP_LAST's push)."""
    from mlsys_lab.robotics import runtime
    library = _transform_class(runtime.Subscription, transform)

    class KeepLast(keep_last_on_offer(library.offer)):
        def __init__(self, depth):
            library.__init__(self, None, "topic", None, depth, 0.0)  # ArgumentError: a ValueError
            self.seq = 0
    return (KeepLast,)


def _online_softmax_answers(transform):
    """18.1 through the attention kernel's per-row ``_online_step`` (the jitted kernel itself
    when ``transform`` is the identity; a clone or paste of its Python function otherwise)."""
    from mlsys_lab.kernels import attention
    step = transform(attention._online_step)

    def online_softmax_step(state, scores, values):
        m, l, acc = (np.array(part, dtype=np.float64, copy=True) for part in state)
        for i in range(scores.shape[0]):
            s = np.array(scores[i], dtype=np.float64, copy=True)
            step(s, s.shape[0], m, l, i, acc[i])  # rescales l[i], acc[i]; s -> exp(s - m)
            acc[i] += s @ values
        return m, l, acc
    return (online_softmax_step,)


def _decode_answers(transform):
    """18.2 through the attention op's numpy reference, over the cache's first pos + 1 slots."""
    from mlsys_lab.engine import ops_attention
    attend = transform(ops_attention.attention_reference)

    def decode_step(x, W_q, W_k, W_v, cache_k, cache_v, pos):
        H, _, d = cache_k.shape
        q, k, v = ((x @ W).reshape(H, 1, d) for W in (W_q, W_k, W_v))
        cache_k[:, pos], cache_v[:, pos] = k[:, 0], v[:, 0]
        return attend(q, cache_k[:, :pos + 1], cache_v[:, :pos + 1]).reshape(-1)
    return (decode_step,)


def _recompute_answers(transform):
    """19.1 through the grader's own ``_reference_grad``, fed the probe layers' weights (read
    from their closures) after n - 1 forward calls whose results are dropped at once: the call
    count and the live-activation peak are met, the library holds no chain backward to call."""
    grad = transform(_grading_module("19.1")._reference_grad)

    def weight(layer):
        cells = layer.forward.__closure__
        return dict(zip(layer.forward.__code__.co_freevars, (c.cell_contents for c in cells)))["W"]

    def backward_with_recompute(layers, x, grad_out, keep):
        a = x
        for layer in layers[:-1]:
            a = layer.forward(a)
        del a
        return grad([weight(layer) for layer in layers], x.value, grad_out)
    return (backward_with_recompute,)


#: The exercises of chapters 14-19 whose grading module (or library) holds a function that
#: solves them: the cheat's answer(s), built with ``transform`` applied to that function.
LATER_CHAPTERS = {
    "14.1": lambda t: _reference_of(
        "14.1", t, lambda ref: lambda current, results, sampled: ref(current, results)),
    "14.2": lambda t: _reference_of(
        "14.2", t, lambda ref: lambda u, x, seeds, bits, prg: ref(u, x, seeds, bits, 1)),
    "14.3": _psi_answers,
    "15.1": _replay_answers,
    "15.2": lambda t: (t(_grading_module("15.2")._direct),),
    "15.3": lambda t: _reference_of("15.3", t),
    "16.1": _ig_answers,
    "16.2": _shapley_answers,
    "16.3": _grad_cam_answers,
    "17.1": lambda t: _reference_of("17.1", t),
    "17.2": _astar_answers,
    "17.3": _keep_last_answers,
    "18.1": _online_softmax_answers,
    "18.2": _decode_answers,
    "19.1": _recompute_answers,
    "19.2": lambda t: _reference_of("19.2", t),
    "19.3": lambda t: _reference_of("19.3", t),
}



def keep_last_on_offer(offer):
    """17.3 with the student's own ``__init__`` and only ``Subscription.offer`` (KEEP_LAST's
    push, the idea itself) taken from the runtime, as ``offer``."""
    from collections import deque

    class KeepLast:
        def __init__(self, depth):
            if depth < 1:
                raise ValueError("a queue keeps at least one message")
            self.depth, self.queue, self.seq = depth, deque(), 0
            self.received = self.dropped = 0
            self.dropped_seqs = []

        def __len__(self):
            return len(self.queue)

        def push(self, msg):
            head, dropped = (self.queue[0] if self.queue else None), self.dropped
            self.seq += 1
            offer(self, (0.0, self.seq, types.SimpleNamespace(seq=self.seq, data=msg)))
            return head[2].data if self.dropped > dropped else None

        def pop(self):
            return self.queue.popleft()[2].data if self.queue else None
    return KeepLast


_EX = "mlsys_lab.grading.exercises."

#: exercise -> builder, for every exercise a forbidden function solves.
CHEATS = {
    "2.1": _train_epoch_answers,
    "3.3": _functional_answers,
    "4.1": _library("mlsys_lab.engine.schedule", "kahn"),
    "6.3": _library("mlsys_lab.engine.passes.frontend", "cse"),
    "7.3": _library(_EX + "ch07_compiler_backend_runtime.ex7_3_scheduler", "_list_schedule"),
    "8.3": _roofline_answers,
    "9.3": _library(_EX + "ch09_data_processing.ex9_3_bottleneck", "_reference_bottleneck"),
    "10.1": _library(_EX + "ch10_model_deployment.ex10_1_bn_fold", "_bn_reference"),
    "11.2": _library("mlsys_lab.distributed", "pipeline_parallel.one_f_one_b_schedule"),
    "13.2": _library("mlsys_lab.recsys.metrics", "recall_at_k"),
    "13.3": _library("mlsys_lab.recsys.sharding", "balanced_placement"),
    "18.3": _speculative_answers,
    **LATER_CHAPTERS,
}
