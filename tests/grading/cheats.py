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


def _functional_answers(transform):
    """3.3: the reference's loss gradient inside a hand-written step."""
    from mlsys_lab.grading.exercises.ch03_programming_interface import ex3_3_functional as ch03
    ref = transform(ch03._ref_loss_grad)

    def sgd_step(params, X, y, lr):
        _, g = ref(params, X, y)
        return {k: params[k] - lr * g[k] for k in params}
    return (_softmax_loss, sgd_step)


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


def _transform_class(cls, transform, bases=None):
    """A copy of ``cls`` (on ``bases``, default its own) whose every function, static methods'
    too, has gone through ``transform``."""

    def one(v):
        fn = v.__func__ if isinstance(v, staticmethod) else v
        if not isinstance(fn, types.FunctionType) or fn.__name__ == "<lambda>":
            return v  # a lambda cannot be pasted (inspect.getsource gives its whole line)
        return staticmethod(transform(fn)) if isinstance(v, staticmethod) else transform(fn)
    namespace = {k: one(v) for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return type(cls.__name__, bases or cls.__bases__, namespace)


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


def _low_rank_answers(transform):
    from mlsys_lab.nn.layers import Linear
    linear = transform(Linear.forward)

    class LowRankLinear(ml.nn.Module):
        def __init__(self, in_features, out_features, rank, rng=None):
            if not 1 <= rank <= min(in_features, out_features):
                raise ValueError(f"rank must lie in 1..{min(in_features, out_features)}")
            super().__init__()
            self.sizes = (in_features, out_features, rank)
            rng = np.random.default_rng(rng)
            init = ml.nn.init.kaiming_uniform
            self.U = ml.nn.Parameter(init((in_features, rank), rng, gain=1.0))
            self.V = ml.nn.Parameter(init((rank, out_features), rng, gain=1.0))
            self.bias = ml.nn.Parameter(ml.nn.init.zeros((out_features,)))

        def forward(self, x):
            n_in, n_out, rank = self.sizes
            first = types.SimpleNamespace(weight=self.U, bias=None, in_features=n_in,
                                          out_features=rank)
            second = types.SimpleNamespace(weight=self.V, bias=self.bias, in_features=rank,
                                           out_features=n_out)
            return linear(second, linear(first, x))
    return (LowRankLinear,)


def _softplus_answers(transform):
    from mlsys_lab.engine import autodiff
    from mlsys_lab.engine.registry import REGISTRY, AVal, Op, register
    from mlsys_lab.engine.tensor import apply
    vjp_of = transform(autodiff.vjp)
    name = "softplus_cheat_A"

    def built_in(x):
        return ml.ops.log(1.0 + ml.ops.exp(x))

    def vjp(g, inputs, out, needs):
        return vjp_of(built_in, inputs[0])[1](g)

    def jvp(tangents, inputs, out):
        return vjp_of(built_in, inputs[0])[1](tangents[0])[0]  # elementwise: J = J^T

    REGISTRY.pop(name, None)
    register(Op(name, lambda x: np.logaddexp(0.0, x), lambda x: AVal(x.shape, x.dtype), vjp,
                jvp, elementwise=True))

    def softplus(x):
        return apply(REGISTRY[name], x)
    return (softplus,)


def _classify_answers(transform):
    from mlsys_lab.engine.graph import Graph
    ancestors = transform(Graph.ancestors)

    def classify(graph, a, b):
        if any(v.producer is a for v in b.inputs) or any(v.producer is b for v in a.inputs):
            return "direct"
        if a in ancestors(graph, b) or b in ancestors(graph, a):
            return "indirect"
        return "independent"
    return (classify,)


def _unroll_answers(transform):
    from mlsys_lab.engine.graph import Graph
    copy = transform(Graph.copy)

    def unroll(body, n):
        nodes, consts, first, carry = [], {}, None, None
        for i in range(n):
            g = copy(body)  # fresh Values and Nodes (constant arrays shared)
            for v in g.values():
                v.name = f"{v.name}_{i}"
            (x,), (y,) = g.inputs, g.outputs
            if carry is None:
                first = x
            else:
                for node in g.nodes:
                    node.inputs = [carry if v is x else v for v in node.inputs]
            nodes += g.nodes
            consts.update(g.consts)
            carry = y
        return Graph([first], nodes, [carry], consts)
    return (unroll,)


def _vjp_rules_answers(transform):
    from mlsys_lab.engine import ops_math, ops_shape
    unbroadcast = transform(ops_math.unbroadcast)
    tanh_rule = transform(ops_math.TANH.vjp)
    matmul_rule = transform(ops_shape.MATMUL.vjp)

    def vjp_mul(g, a, b):
        return unbroadcast(g * b, np.shape(a)), unbroadcast(g * a, np.shape(b))

    def vjp_tanh(g, x):
        return tanh_rule(g, (x,), np.tanh(x), (True,))[0]

    def vjp_matmul(g, a, b):
        ga, gb = matmul_rule(ml.tensor(g), (ml.tensor(a), ml.tensor(b)), None, (True, True))
        return ga.numpy(), gb.numpy()
    return (vjp_mul, vjp_tanh, vjp_matmul)


def _dual_answers(transform):
    from mlsys_lab.engine import ops_math
    mul_rule, sin_rule, log_rule = (transform(op.jvp) for op in
                                    (ops_math.MUL, ops_math.SIN, ops_math.LOG))

    def lift(x):
        return x if isinstance(x, Dual) else Dual(x, 0.0)

    class Dual:
        def __init__(self, value, tangent):
            self.value, self.tangent = value, tangent

        def __add__(self, other):
            other = lift(other)
            return Dual(self.value + other.value, self.tangent + other.tangent)

        __radd__ = __add__

        def __sub__(self, other):
            other = lift(other)
            return Dual(self.value - other.value, self.tangent - other.tangent)

        def __rsub__(self, other):
            return lift(other) - self

        def __mul__(self, other):
            other = lift(other)
            tangent = mul_rule((self.tangent, other.tangent), (self.value, other.value), None)
            return Dual(self.value * other.value, tangent)

        __rmul__ = __mul__

        def sin(self):
            x = ml.tensor(np.asarray(self.value, dtype=np.float64))  # the rule calls ml cos
            return Dual(np.sin(self.value), sin_rule((self.tangent,), (x,), None).numpy())

        def log(self):
            return Dual(np.log(self.value), log_rule((self.tangent,), (self.value,), None))
    return (Dual,)


def _shard_sampler(transform):
    from mlsys_lab.grading.exercises.ch09_data_processing import ex9_2_shard_sampler as ex
    shard = _with_helpers(transform, ex._reference_shard, "_epoch_order")

    class ShardSampler:
        def __init__(self, n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
            if num_replicas < 1 or not 0 <= rank < num_replicas:
                raise ValueError("rank must lie in 0..num_replicas-1")
            self.args, self.epoch = (n, num_replicas, rank, seed), 0
            self.shuffle, self.drop_last = shuffle, drop_last

        def set_epoch(self, epoch):
            self.epoch = epoch

        def _indices(self):
            return shard(*self.args, self.epoch, self.shuffle, self.drop_last)

        def __iter__(self):
            return iter(self._indices())

        def __len__(self):
            return len(self._indices())
    return (ShardSampler,)


def _quantizer(transform):
    from mlsys_lab.deploy.quant import observers
    from mlsys_lab.grading.exercises.ch10_model_deployment import ex10_2_quantizer as ex
    Observer = _transform_class(observers.MinMaxObserver, transform)
    quantize = transform(ex._q_reference)

    class ChannelQuantizer:
        def __init__(self, axis, bits=8):
            self.observer, self.axis, self.bits = Observer(axis), axis, bits

        def observe(self, x):
            self.observer.update(x)

        def scale(self):
            lo, hi = self.observer.range()
            amax = np.maximum(-lo, hi)
            return np.where(amax > 0, amax / (2 ** (self.bits - 1) - 1), 1.0)

        def quantize(self, x):
            return quantize(x, self.scale(), self.axis, self.bits)

        def dequantize(self, q):
            shape = [1] * q.ndim
            shape[self.axis] = -1
            return q * self.scale().reshape(shape)
    return (ChannelQuantizer,)


def _pruning(transform):
    from mlsys_lab.deploy.compress import prune
    masks = _with_helpers(transform, prune.magnitude_masks, "_check_sparsity", "prunable",
                          "_smallest")

    def prune_to_sparsity(weights, sparsity, scope="global"):
        params = [(n, types.SimpleNamespace(ndim=w.ndim, numpy=lambda w=w: w))
                  for n, w in weights.items()]
        model = types.SimpleNamespace(named_parameters=lambda: params)
        return masks(model, sparsity, scope)
    return (prune_to_sparsity,)


def _ring(transform):
    from mlsys_lab.distributed.collectives import all_reduce
    ring = transform(all_reduce.ring_allreduce)

    def ring_allreduce(comm, x):
        if comm.size == 1:
            return x.copy()
        return (yield from ring(comm, x, np.add, "ring_allreduce"))
    return (ring_allreduce,)


def _zero(transform):
    from mlsys_lab.distributed.parallel import zero
    breakdown = transform(zero.zero_memory_breakdown)

    def zero_memory(P, N, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
        return breakdown(P, N, stage, k=optimizer_bytes, weight_bytes=weight_bytes,
                         grad_bytes=grad_bytes)
    return (zero_memory,)


def _sparse_grad(transform):
    from mlsys_lab.grading.exercises.ch13_recommender_systems import ex13_1_sparse_grad as ex
    grad = transform(ex._reference_grad)

    def sparse_embedding_grad(ids, offsets, grad_out, num_rows, mode):
        out = grad(ids, offsets, grad_out, num_rows, mode)
        values = np.array(list(out.values()), np.float64).reshape(len(out), grad_out.shape[1])
        return np.array(list(out), np.int64), values
    return (sparse_embedding_grad,)


def _rebind(fn, **names):
    """``fn`` (its Python function, if a Numba dispatcher) reading ``names`` from its globals
    instead: the helpers pasted (or cloned) beside it, as in one notebook cell."""
    fn = getattr(fn, "py_func", fn)
    out = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__,
                             fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def _with_helpers(transform, fn, *helpers):
    """``transform(fn)`` calling transformed copies of the module-level ``helpers`` it names (a
    clone or paste of the whole chain, not of its top function only)."""
    done = transform(fn)
    return _rebind(done, **{name: transform(done.__globals__[name]) for name in helpers})

def _keep_cell_source(fn, original):
    """Keep the source of ``fn`` when it was pasted into ``"<cell>"`` (H2), as IPython keeps a
    cell's: 8.1's judge reads the kernel's source. The library's code and a clone's are left
    alone (a clone claiming a stdlib file shows that file's lines, as it would in a notebook)."""
    import inspect
    import linecache
    import textwrap
    code = getattr(fn, "py_func", fn).__code__
    if code.co_filename == "<cell>":
        text = textwrap.dedent(inspect.getsource(getattr(original, "py_func", original)))
        lines = ["\n"] * (code.co_firstlineno - 1) + text.splitlines(True)
        linecache.cache["<cell>"] = (len(text), None, lines, "<cell>")


def _greedy_by_size(transform):
    """7.1 through the strategies' ``_Placed`` columns (their gap search is the placement's work;
    ``greedy_by_size`` itself, a sort and a call, is too small to be matched as a paste)."""

    from mlsys_lab.engine.memory import strategies
    placed_class = _transform_class(strategies._Placed, transform)

    def greedy_by_size(records):
        placed, offsets = placed_class(len(records)), {}
        for r in sorted(records, key=lambda r: (-r.size, r.start)):
            lo, hi = placed.gaps(r)
            offsets[r.id] = int(lo[np.argmax(hi - lo >= r.size)])
            placed.add(r, offsets[r.id])
        return offsets
    return (greedy_by_size,)


def _tiled_matmul(transform):
    """8.1 through the CPU rung's ``_tiled_kernel`` and the ``_tile_update`` it calls, both
    jitted again (as a student pasting both into a cell would: the kernel calls the copy)."""
    from numba import njit

    from mlsys_lab.kernels import cpu
    update = njit(_rebind(transform(cpu._tile_update)))
    pasted = transform(cpu._tiled_kernel)
    _keep_cell_source(pasted, cpu._tiled_kernel)
    kernel = njit(_rebind(pasted, _tile_update=update))

    def matmul_tiled(a, b):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
        kernel(a, b, c)
        return c
    return (matmul_tiled, kernel)


def _shared_matmul(transform):
    """8.2 through the CUDA ladder's ``_shared_kernel`` factory (its nested ``shared`` kernel)
    and the ``_helpers`` factory of the device functions it calls, at the simulator's sizes."""
    import math

    from numba import cuda

    from mlsys_lab.kernels import cuda as ladder
    cfg = ladder.SIMULATOR_CONFIGS["shared"]
    factory = _rebind(transform(ladder._shared_kernel), _helpers=transform(ladder._helpers))
    kernel = factory(cfg, np.dtype(np.float32), False)
    bm, bn, block = cfg.block_m, cfg.block_n, (cfg.threads_x, cfg.threads_y)  # TileConfig's
    # properties are the library's (forbidden) code: read them here, not in the probe

    def matmul_shared(a, b):
        (m, _), n = a.shape, b.shape[1]
        d_c = cuda.device_array((m, n), np.float32)
        kernel[(math.ceil(n / bn), math.ceil(m / bm)), block](cuda.to_device(a),
                                                               cuda.to_device(b), d_c)
        return d_c.copy_to_host()
    return (matmul_shared,)


def _roofline(transform):
    """8.3: gemm_bytes through ``matmul_intensity`` (2mnk over the bytes it counts)."""
    from mlsys_lab.kernels import roofline
    intensity = transform(roofline.matmul_intensity)
    return (transform(roofline.tile_intensity),
            lambda m, n, k, dtype_bytes: 2 * m * n * k / intensity(m, n, k, dtype_bytes),
            transform(roofline.attainable))


def _parallel_map(transform):
    """9.1 through the data pipeline's thread pool: ``Pool`` (a lane per producer, the
    dispatcher, the worker loop, the round-robin consumer, the shutdown) and ``ThreadPool``'s
    methods, run for a minimal map node and context."""
    import queue
    import threading

    from mlsys_lab.data.pipeline import pools
    pool_class = _transform_class(pools.ThreadPool, transform,
                                  bases=(_transform_class(pools.Pool, transform),))
    # ThreadPool.make_queue is a lambda, which a paste cannot take: the student's own here
    pool_class.make_queue = staticmethod(lambda depth: queue.Queue(maxsize=depth))

    def parallel_map(fn, items, num_workers):
        node = types.SimpleNamespace(name="map", kind="map", num_parallel=num_workers,
                                     deterministic=True, apply=lambda item, epoch, n: fn(item))
        ctx = types.SimpleNamespace(closing=threading.Event(), timeout=None,
                                    waited=lambda *args: None, work=lambda *args: None)
        return pool_class(node, ctx, (0,), (item for item in items)).results()
    return (parallel_map,)


_EX = "mlsys_lab.grading.exercises."

#: exercise -> builder, for every exercise a forbidden function solves.
CHEATS = {
    "2.1": _library(_EX + "ch02_introduction.ex2_1_train_epoch", "_ref_epoch"),
    "2.2": _library(_EX + "ch02_introduction.ex2_2_evaluate", "_ref_accuracy"),
    # 2.3 has none: nothing forbidden saves or restores a checkpoint (ml.save and the
    # state dicts are the tools the exercise teaches).
    "3.1": _low_rank_answers,  # Linear.forward twice; the parameters are written by hand
    "3.2": _softplus_answers,  # autodiff.vjp inside both rules
    "3.3": _functional_answers,
    "4.1": _library("mlsys_lab.engine.schedule", "kahn"),
    "4.2": _classify_answers,  # Graph.ancestors; the direct test by hand
    "4.3": _unroll_answers,  # Graph.copy per iteration, chained
    "4.4": _library(_EX + "ch04_computational_graph.ex4_4_chain_rule", "_chain_reference"),
    "6.1": _vjp_rules_answers,  # the library's unbroadcast, tanh and matmul rules
    "6.2": _dual_answers,  # the library's product, sin and log tangent rules
    "6.3": _library("mlsys_lab.engine.passes.frontend", "cse"),
    "6.4": _library("mlsys_lab.engine.passes.frontend", "constant_folding"),
    "7.1": _greedy_by_size,  # the strategies' _Placed gap search
    "7.2": _library("mlsys_lab.engine.passes.backend", "cancel_transposes"),
    "7.3": _library(_EX + "ch07_compiler_backend_runtime.ex7_3_scheduler", "_list_schedule"),
    # 7.4: the grader's decoder (no Python function of the library decodes these formats;
    # the forbidden numpy and struct functions are C functions)
    "7.4": _library(_EX + "ch07_compiler_backend_runtime.ex7_4_fp8", "_fp8_reference"),
    "8.1": _tiled_matmul,  # the CPU rung's tiled kernel and its tile update, jitted again
    "8.2": _shared_matmul,  # the CUDA ladder's shared-memory kernel (the simulator)
    "8.3": _roofline,  # gemm_bytes through matmul_intensity
    "8.4": _library("mlsys_lab.kernels.conv", "winograd_f23"),
    "9.1": _parallel_map,  # the pipeline's Pool and ThreadPool
    "9.2": _shard_sampler,  # the reference shard and its epoch order, in a small class
    "9.3": _library(_EX + "ch09_data_processing.ex9_3_bottleneck", "_reference_bottleneck"),
    "10.1": _library(_EX + "ch10_model_deployment.ex10_1_bn_fold", "_bn_reference"),
    "10.2": _quantizer,  # MinMaxObserver for the calibration, _q_reference to quantize
    "10.3": _pruning,  # magnitude_masks and its helpers, on a stand-in model
    "11.1": _ring,  # the library's raw ring (collectives.allreduce asks comm.batched)
    "11.2": _library("mlsys_lab.distributed", "pipeline_parallel.one_f_one_b_schedule"),
    "11.3": _zero,  # zero_memory_breakdown
    "11.4": lambda t: (_transform_class(_grading_module("11.4")._ReferenceSSP, t),),
    "13.1": _sparse_grad,  # the reference's {row: grad} as (rows, values)
    "13.2": _library("mlsys_lab.recsys.metrics", "recall_at_k"),
    "13.3": _library("mlsys_lab.recsys.sharding", "balanced_placement"),
    "18.3": _speculative_answers,
    **LATER_CHAPTERS,
}
