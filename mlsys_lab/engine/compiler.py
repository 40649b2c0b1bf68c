"""``ml.compile``: trace -> passes -> operator selection -> memory plan -> arena execution.

Every intermediate tensor of the compiled graph lives at its planned offset inside one arena
(a single numpy byte buffer), and kernels write straight into those views. A planner bug therefore
shows up as a wrong result, not only as a wrong picture. View ops (reshape, transpose,
broadcast_to) produce numpy views of their input instead of copies, and keep that input alive.
"""

import builtins
import functools
import inspect
import time

import numpy as np

from ..errors import ArgumentError, GraphError, MLSysError, OpError, OutOfMemoryError, ShapeError
from . import memory
from . import threads as thread_pools
from .graph import check_input
from .interpreter import error_cause, node_error
from .pytree import flatten, unflatten
from .registry import REGISTRY, get
from .runtime import Timeline, as_input, node_span
from .selection import device as find_device
from .selection import explain_selection, makes_view, select
from .trace import static_key, static_positions, trace


def value_lifetimes(graph, order):
    """Lifetimes of the intermediates that need arena memory (inputs, constants and view-op
    outputs excluded; a view keeps the tensor it looks into alive until the view's last use)."""
    recs = {r.id: r for r in memory.lifetimes(graph, order, include_inputs=False)}
    root = {}
    for n in order:
        if get(n.op).view is not None:
            src = n.inputs[0]
            root[n.outputs[0]] = root.get(src, src)
    for view, src in root.items():
        r = recs.pop(view)
        if src in recs:
            s = recs[src]
            recs[src] = memory.Lifetime(s.id, s.size, s.start, max(s.end, r.end), s.long_lived)
    return list(recs.values()), root


class Executable:
    """One specialisation of a compiled function: the graph traced for one set of static
    argument values, optimised, planned and turned into straight-line code. Attributes show
    each stage for the notebooks:

    ``source_graph`` (as traced), ``stages`` (each pass's output), ``graph`` (optimised and
    annotated with kernels), ``lifetimes``, ``plan`` (MemoryPlan), ``code`` (the generated
    Python; ``timed_code`` is the profiled run's version, a clock read around each call),
    ``timeline`` (last profiled run).
    """

    def __init__(self, f, *example_args, passes="default", device="cpu", fallback=("cpu",),
                 strategy="best", inplace=True, static_argnums=(), name=None, donate=(),
                 threads="coordinate"):
        find_device(device)  # unknown names fail here, before tracing and the passes
        memory.check_strategy(strategy)
        thread_setting = _check_threads(threads)
        self.source_graph = trace(f, *example_args, name=name, static_argnums=static_argnums)
        self.static_argnums = static_argnums
        self._static = static_positions(static_argnums, len(example_args))
        self.stages = [("traced", self.source_graph)]
        g = self.source_graph
        if passes:
            from .passes import default_pipeline, run_pipeline

            result = run_pipeline(g, default_pipeline() if passes == "default" else passes)
            self.stages += [(name_, gr) for name_, gr, *_ in result.stages]
            g = result.graph
        g = select(g, device, fallback)
        self.stages.append((f"select({device})", g))
        self.graph = g.lint()
        self.order = list(g.nodes)
        self.lifetimes, self._view_root = value_lifetimes(g, self.order)
        self.donated = self._donations(donate)
        self.lifetimes = [r for r in self.lifetimes if r.id not in self.donated]
        pairs = self._inplace_pairs() if inplace else []
        self.plan = memory.plan(self.lifetimes, strategy, inplace=pairs)
        memory.verify(self.plan, self.lifetimes)
        self.arena = self._allocate_arena()
        self._build()
        self.timeline = Timeline()
        self._out_tree = self.source_graph.out_tree
        # __call__'s fast path: no static arguments and each argument one graph input (no
        # nesting), so a call with numpy arrays only needs no flattening.
        self._plain_args = not self._static and len(example_args) == len(g.inputs) and not any(
            isinstance(a, (tuple, list, dict)) for a in example_args)
        self.thread_limits = (pool_coordination(g) if thread_setting == "coordinate"
                              else thread_setting)

    def _allocate_arena(self):
        size = max(self.plan.arena_size, 1)
        try:
            return np.zeros(size, np.uint8)
        except (MemoryError, ValueError) as e:  # ValueError: larger than numpy can index
            big = sorted(self.lifetimes, key=lambda r: -r.size)[:3]
            names = ", ".join(f"{r.id!r} ({r.size:,} B) from node #{r.id.producer.id} "
                              f"{r.id.producer.op}" for r in big if r.id.producer is not None)
            raise OutOfMemoryError(
                f"compile {self.graph.name}: the memory plan needs an arena of {size:,} bytes "
                f"({size / 2**30:,.1f} GiB), which cannot be allocated ({e}); largest "
                f"tensors: {names}") from None

    def _inplace_pairs(self):
        """memory.inplace_pairs, kept where they still hold once views extend lifetimes: the
        input must die where the output is born, and a non-elementwise op may not read it
        through a view at another position."""
        recs = {r.id: r for r in self.lifetimes}
        elementwise = {name for name, op in REGISTRY.items() if op.elementwise}
        overwrites = {name: op.inplace for name, op in REGISTRY.items() if op.inplace}
        return [(o, i) for o, i in memory.inplace_pairs(self.graph, self.order, elementwise,
                                                        overwrites)
                if o in recs and i in recs and recs[i].end == recs[o].start
                and self._may_overwrite(o.producer, i)]

    def _may_overwrite(self, node, src):
        """Whether ``node`` may write its output over ``src``'s buffer: it is elementwise, or
        ``src`` sits at one of its op's ``inplace`` positions and is read nowhere else by the
        node (views of it included)."""
        op = get(node.op)
        if op.elementwise:
            return True
        roots = [self._view_root.get(v, v) for v in node.inputs]
        return roots.count(src) == 1 and any(node.inputs[k] is src for k in op.inplace)

    def _donations(self, donate):
        """Output value -> input value whose buffer it may overwrite.

        ``donate`` lists (input index, output index) pairs (flattened positions). A pair is
        honoured when the output is made by a node that may overwrite that input (an
        elementwise node, or the input is at one of its op's ``inplace`` positions) and is the
        last reader of the input (views of it included), and the input (or a view of it) is
        not itself returned: then the result is written straight into the caller's input
        array, as a training step updates its parameters in place."""
        g, out = self.graph, {}
        donate = self._check_donate(donate)
        readers = {}
        for step, n in enumerate(self.order):
            for v in n.inputs:
                readers.setdefault(self._view_root.get(v, v), []).append(step)
        returned = {self._view_root.get(v, v) for v in g.outputs}
        for i, j in donate:
            src, dst = g.inputs[i], g.outputs[j]
            node = dst.producer
            if (node is None or src.aval != dst.aval or src in returned
                    or dst in g.outputs[:j] + g.outputs[j + 1:]):
                continue
            if not self._may_overwrite(node, src):
                continue
            if max(readers.get(src, [-1])) == self.order.index(node):
                out[dst] = src
        return out

    def _check_donate(self, donate):
        """``donate`` as a list of (input, output) index pairs; GraphError for anything else."""
        n_in, n_out = len(self.graph.inputs), len(self.graph.outputs)
        pairs = []
        for pair in donate:
            ok = (isinstance(pair, (tuple, list)) and len(pair) == 2
                  and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                          for k in pair))
            if not ok or not (-n_in <= pair[0] < n_in and -n_out <= pair[1] < n_out):
                raise GraphError(
                    f"compile {self.graph.name}: donate pair {pair!r} must be (input index, "
                    f"output index) within the {n_in} inputs and {n_out} outputs of the "
                    f"flattened signature")
            pairs.append((int(pair[0]) % n_in, int(pair[1]) % n_out))
        return pairs

    def _view(self, v):
        off = self.plan.offsets[v]
        return self.arena[off:off + v.nbytes].view(v.dtype).reshape(v.shape)

    def _build(self):
        g = self.graph
        self._slot = {}
        env = []

        def slot(v):
            if v not in self._slot:
                self._slot[v] = len(env)
                env.append(None)
            return self._slot[v]

        for v in g.inputs:
            slot(v)
        for v, arr in g.consts.items():
            env[slot(v)] = arr
        self._steps = []
        for n in self.order:  # each node runs the kernel selection chose for it, nothing else
            kernel = n.meta.get("kernel")
            if kernel is None:
                raise GraphError(f"compile {g.name}: node #{n.id} {n.op} has no selected "
                                 f"kernel (the graph must come from select)")
            out = n.outputs[0]
            ins = [slot(v) for v in n.inputs]
            o = slot(out)
            is_view = makes_view(n)
            if is_view != (get(n.op).view is not None):
                raise GraphError(f"compile {g.name}: node #{n.id} {n.op} was given "
                                 f"{kernel.name}, but a view op must run as its view")
            if not is_view and out not in self.donated:
                env[o] = self._view(out)
            self._steps.append((n, is_view, kernel.out_fn, o, ins, n.attrs))
        self._env = env
        self._input_slots = [self._slot[v] for v in g.inputs]
        self._input_specs = [(v, self._slot[v], tuple(v.shape), np.dtype(v.dtype))
                             for v in g.inputs]
        self._output_slots = [self._slot[v] for v in g.outputs]
        self._donated_slots = [(self._slot[d], self._slot[s]) for d, s in self.donated.items()]
        self._codegen()

    def _codegen(self):
        """Generate straight-line Python for the schedule (like torch.fx's code generation):
        one call per node with its buffers bound in advance, no per-node interpretation.
        The source is kept in ``self.code`` for reading. A second function, ``run_timed``,
        is the same code with a clock read around each call (the profiled run); it is kept in
        ``self.timed_code``."""
        g, static = self.graph, {"clock": time.perf_counter}
        fixed = {self._slot[v] for v in g.consts} | {
            self._slot[n.outputs[0]] for n in self.order
            if get(n.op).view is None and n.outputs[0] not in self.donated}

        def name(i):
            if i in fixed:
                static.setdefault(f"b{i}", self._env[i])
                return f"b{i}"
            return f"t{i}"

        def body(timed):
            lines, line_node = ["def run_timed(env, ts):" if timed else "def run(env):"], {}
            lines += [f"    t{self._slot[v]} = env[{self._slot[v]}]"
                      for v in list(g.inputs) + list(self.donated)]
            for k, (n, is_view, fn, o, ins, attrs) in enumerate(self._steps):
                static[f"k{k}"] = functools.partial(fn, **attrs) if attrs else fn
                args = ", ".join(name(i) for i in ins)
                call = f"k{k}({args})" if is_view else f"k{k}({name(o)}, {args})"
                if timed:
                    lines.append(f"    ts[{2 * k}] = clock()")
                lines.append(f"    {name(o)} = {call}" if is_view else f"    {call}")
                lines[-1] += f"  # #{n.id} {n.outputs[0].name} = {n.op}"
                line_node[len(lines)] = n
                if timed:
                    lines.append(f"    ts[{2 * k + 1}] = clock()")
            lines += [f"    env[{self._slot[v]}] = t{self._slot[v]}" for v in g.outputs
                      if self._slot[v] not in fixed]
            lines.append("    return None")  # a body even when nothing is left to run
            return "\n".join(lines), line_node

        self.code, self._line_node = body(False)
        self.timed_code, timed_lines = body(True)
        exec(builtins.compile(self.code, f"<compiled {g.name}>", "exec"), static)
        exec(builtins.compile(self.timed_code, f"<compiled {g.name} (timed)>", "exec"), static)
        self._run, self._run_timed = static["run"], static["run_timed"]
        self._lines_of = {self._run.__code__: self._line_node,
                          self._run_timed.__code__: timed_lines}
        self._times = [0.0] * (2 * len(self._steps))
        # What each node's span is labelled with, worked out once (the spans themselves are
        # built when ``timeline`` is read, so a profiled call only reads the clock).
        self._event_labels = [(n, n.meta.get("device", "cpu")) for n, *_ in self._steps]

    @property
    def timeline(self):
        """The :class:`~mlsys_lab.engine.runtime.Timeline` of the last profiled call (one
        :class:`~mlsys_lab.span.Span` per node, on the node's device, worker ``stream0``);
        empty before one."""
        if self._timeline is None:
            self._timeline = Timeline(self._events())
        return self._timeline

    def _events(self):
        ts = self._times
        return [node_span(n, device, "stream0", ts[2 * k], ts[2 * k + 1])
                for k, (n, device) in enumerate(self._event_labels)]

    @timeline.setter
    def timeline(self, value):
        self._timeline = value

    def __call__(self, *args, out=None, profile=True):
        """Run on new inputs (same shapes/dtypes as the examples). ``out`` optionally lists
        arrays to write the outputs into (e.g. parameters updated in place)."""
        flat = args  # the fast path: arrays in the graph's input order, nothing to flatten
        if self._plain_args and len(args) == len(self._input_slots):
            for a in args:
                if type(a) is not np.ndarray:
                    flat = None
                    break
        else:
            flat = None
        if flat is None:
            flat, _ = flatten([a for i, a in enumerate(args) if i not in self._static])
        results = self.call_flat(flat, out, profile)
        tree = self._out_tree
        if tree == "auto":
            return results[0] if len(results) == 1 else tuple(results)
        return unflatten(tree, results)

    def call_flat(self, flat, out=None, profile=True):
        """``__call__`` on inputs already flattened into the graph's input order; returns the
        flat list of outputs. Everything is checked before anything runs: a donated input
        given as a read-only array is copied (donation lets the output reuse the buffer; it
        never obliges it), and a read-only ``out`` array is refused."""
        g, env = self.graph, self._env
        if len(flat) != len(self._input_slots):
            raise GraphError(f"{g.name}: expects {len(g.inputs)} inputs, got {len(flat)}")
        if out is not None:
            self._check_out(out)
        for (v, slot, shape, dtype), a in zip(self._input_specs, flat):
            if type(a) is not np.ndarray:
                a = as_input(a, v.dtype, f"{g.name}: input {v.name}")
            if a.shape != shape or a.dtype != dtype:
                check_input(g.name, v, a.shape, a.dtype)  # raises, naming the input
            env[slot] = a
        for dst, src in self._donated_slots:
            a = env[src]
            if not a.flags.writeable:
                a = env[src] = a.copy()
            env[dst] = a
        limits = self.thread_limits
        if limits:
            with thread_pools.limit_threads(**limits):
                self._execute(env, profile)
        else:
            self._execute(env, profile)
        if out is None:
            return [np.array(env[slot], copy=True) for slot in self._output_slots]
        results = []
        for slot, dst in zip(self._output_slots, out):
            val = env[slot]
            if dst is None:
                results.append(np.array(val, copy=True))
                continue
            if dst is not val:
                np.copyto(dst, val)
            results.append(dst)
        return results

    def _execute(self, env, profile):
        """Run the generated code on ``env`` (the timed version when ``profile``); a failure
        is raised naming the node whose line raised it."""
        try:
            if profile:
                self._timeline = None
                self._run_timed(env, self._times)
            else:
                self._run(env)
        except Exception as e:
            node = self._failed_node(e.__traceback__)
            if profile:  # the timeline of a failed run: the nodes that finished before it
                done = self.order.index(node) if node is not None else 0
                self._timeline = Timeline(self._events()[:done])
            if node is not None:
                raise node_error(e, node) from error_cause(e)
            if isinstance(e, MLSysError):
                raise
            raise OpError(f"compiled run failed: {type(e).__name__}: {e}") from e

    def _check_out(self, out):
        outs = self.graph.outputs
        if len(out) != len(outs):
            raise GraphError(f"{self.graph.name}: out lists {len(out)} arrays for "
                             f"{len(outs)} outputs")
        for k, (dst, v) in enumerate(zip(out, outs)):
            if dst is None:
                continue
            if not isinstance(dst, np.ndarray) or not dst.flags.writeable:
                got = "a read-only array" if isinstance(dst, np.ndarray) else type(dst).__name__
                raise GraphError(f"{self.graph.name}: out[{k}] must be a writeable numpy "
                                 f"array, got {got}")
            if dst.shape != v.shape:
                raise ShapeError(f"{self.graph.name}: out[{k}] has shape {dst.shape}, the "
                                 f"output {v.name} is {v.type_str()}")

    def _failed_node(self, tb):
        """The node whose line of the generated code raised (found from the traceback, so
        nothing runs twice: a rerun would apply in-place parameter updates again)."""
        node = None
        while tb is not None:
            lines = self._lines_of.get(tb.tb_frame.f_code)
            if lines is not None:
                node = lines.get(tb.tb_lineno)
            tb = tb.tb_next
        return node

    def explain(self):
        """Text report of every stage: pass pipeline, kernel selection, memory plan."""
        lines = ["== stages =="]
        for name_, gr in self.stages:
            lines.append(f"  {name_:<28}{len(gr.nodes):>5} nodes")
        lines += ["", "== kernel selection ==", explain_selection(self.graph), "",
                  "== memory plan =="]
        lb = memory.lower_bound(self.lifetimes, self.plan.alignment,
                                inplace=self.plan.inplace)
        naive = memory.naive_size(self.lifetimes, self.plan.alignment)
        lines.append(f"  strategy {self.plan.strategy}: arena {self.plan.arena_size} bytes, "
                     f"lower bound {lb}, no reuse {naive}, in-place pairs "
                     f"{len(self.plan.inplace)}")
        return "\n".join(lines)


_BLAS_MARKS = ("matmul", "gemm", "cblas")  # kernel names that call numpy's BLAS


def _check_threads(threads):
    """The ``threads`` option: ``"coordinate"``, None, or a dict of ``blas``/``numba``
    counts."""
    if threads is None or threads == "coordinate":
        return threads
    if isinstance(threads, dict) and threads and set(threads) <= {"blas", "numba"}:
        for pool, n in threads.items():
            thread_pools.check_count(f"compile: threads[{pool!r}]", n)
        return dict(threads)
    raise ArgumentError(f"compile: threads must be 'coordinate', None or a dict with keys "
                        f"'blas' and/or 'numba', got {threads!r}")


def pool_coordination(graph):
    """The thread limits a selected graph runs under with ``threads="coordinate"``:
    ``{"blas": 1}`` when it runs Numba's parallel kernels (nodes on ``cpu-numba``) and
    BLAS kernels (``cpu`` nodes whose kernel calls numpy's matmul or cblas) back to back,
    else None (nothing to coordinate). With one BLAS thread no BLAS worker wakes, so none
    spins while Numba's workers run (``benchmarks/matmul.py``, section "compiled executor",
    measures the effect)."""
    devices = {n.meta.get("device") for n in graph.nodes}
    blas = any(n.meta.get("device") == "cpu" and n.meta.get("kernel") is not None
               and any(m in n.meta["kernel"].name for m in _BLAS_MARKS) for n in graph.nodes)
    return {"blas": 1} if "cpu-numba" in devices and blas else None


#: The keyword options ``ml.compile`` accepts (those of :class:`Executable`).
_OPTIONS = [p for p in inspect.signature(Executable.__init__).parameters
            if p not in ("self", "f", "example_args")]


class Compiled:
    """A compiled function: ``c = Compiled(f, *example_args, **options)``, then ``c(*args)``.

    Positions in ``static_argnums`` take Python values that are baked into the graph (a
    layer count, a flag). As in ``jax.jit``, each distinct tuple of static values (compared
    with ``==``, each with its type; they must be hashable) is traced and compiled on the
    first call that uses it, and kept in ``specialisations`` (key -> :class:`Executable`).

    The stage attributes ``source_graph``, ``stages``, ``graph``, ``lifetimes``, ``plan``,
    ``code``, ``timeline`` and ``explain()`` are those of ``current``: the specialisation
    the most recent call ran (at first, the one compiled for ``example_args``).
    """

    def __init__(self, f, *example_args, static_argnums=(), **options):
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ArgumentError(f"compile: unknown options {unknown}; known: "
                                f"{', '.join(_OPTIONS)}")
        self.f, self.options = f, options
        self.static_argnums = static_argnums
        self._static = static_positions(static_argnums, len(example_args))
        self.specialisations = {}
        self.current = self._specialise(example_args)

    def _specialise(self, args):
        """The Executable for the static values in ``args`` (traced and compiled if new)."""
        if len(args) <= max(self._static, default=-1):
            raise GraphError(f"{getattr(self.f, '__name__', 'compiled')}: static argument "
                             f"{max(self._static)} is missing (got {len(args)} arguments)")
        key = static_key(args, self._static)
        spec = self.specialisations.get(key)
        if spec is None:
            spec = Executable(self.f, *args, static_argnums=self.static_argnums,
                              **self.options)
            self.specialisations[key] = spec
        self.current = spec
        return spec

    def __getattr__(self, name):
        current = self.__dict__.get("current")  # graph, plan, code, ...: the current one's
        if current is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(current, name)

    def __call__(self, *args, out=None, profile=True):
        """Run on new inputs (same shapes/dtypes as the examples; a new static value compiles
        a new specialisation). ``out`` optionally lists arrays to write the outputs into."""
        spec = self._specialise(args) if self._static else self.current
        return spec(*args, out=out, profile=profile)

    def call_flat(self, flat, out=None, profile=True):
        """Run the current specialisation on inputs flattened into its graph's input order."""
        return self.current.call_flat(flat, out, profile)

    def explain(self):
        """Text report of the current specialisation: passes, kernel selection, memory plan."""
        return self.current.explain()


def compile(f, *example_args, **options):  # noqa: A001 - the public name is ml.compile
    """Compile ``f`` for inputs shaped like ``example_args``; see :class:`Compiled`.

    Options: ``passes`` ("default", a list of passes, or None), ``device`` ("cpu", "cpu-numba",
    "cuda", "npu"), ``fallback``, ``strategy`` (memory planner), ``inplace``,
    ``static_argnums`` (positions of Python values baked into the graph; each new value is
    traced and compiled again, as in ``jax.jit``), ``name``, ``donate`` ((input index, output
    index) pairs whose output may be written into the caller's input array), ``threads``
    (``"coordinate"``: a graph that runs Numba's parallel kernels and BLAS back to back holds
    BLAS at one thread while it runs, see :func:`pool_coordination`; None: the pools as they
    are set; or ``{"blas": n, "numba": m}`` for every call, see :mod:`.threads`).
    """
    return Compiled(f, *example_args, **options)
