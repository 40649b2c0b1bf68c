"""Control flow: ``cond`` — both branches in a traced graph, only the taken one when eager.

``cond`` is an op over graphs: its branches are traced subgraphs and its rules are the graph
transforms of them, so this module sits above tracing and the graph autodiff transform.
"""

import numpy as np

from ..errors import DTypeError, GraphError, ShapeError
from . import dtypes
from .autodiff_graph import jvp_graph, vjp_graph
from .dispatch import apply, no_grad
from .registry import AVal, defop
from .tensor import as_tensor, zeros_like
from .trace import trace_branch


def _check_pred(pred):
    if pred.dtype != dtypes.bool_ or int(np.prod(pred.shape)) != 1:
        raise DTypeError(f"cond: the predicate must be a single bool, got "
                         f"{pred.dtype}{list(pred.shape)}")


def _types(types):
    return ", ".join(f"{dt.name}{list(shape)}" for shape, dt in types) or "nothing"


def _cond_infer(pred, *operands, true_graph, false_graph):
    _check_pred(pred)
    outs = []
    for g in (true_graph, false_graph):
        types = [(tuple(v.shape), np.dtype(v.dtype)) for v in g.inputs]
        given = [(tuple(o.shape), np.dtype(o.dtype)) for o in operands]
        if types != given:
            raise ShapeError(f"cond: branch {g.name} takes {_types(types)}, got {_types(given)}")
        try:
            (aval,) = g.infer(*operands)
        except Exception as e:
            raise GraphError(f"cond: branch {g.name} does not accept the operands: {e}") from None
        outs.append(aval)
    if tuple(outs[0].shape) != tuple(outs[1].shape) or outs[0].dtype != outs[1].dtype:
        raise GraphError(f"cond: the branches return different types: {true_graph.name} gives "
                         f"{outs[0].dtype}{list(outs[0].shape)}, {false_graph.name} gives "
                         f"{outs[1].dtype}{list(outs[1].shape)}")
    return AVal(tuple(outs[0].shape), outs[0].dtype)


def _cond_compute(pred, *operands, true_graph, false_graph):
    g = true_graph if bool(np.asarray(pred).reshape(())) else false_graph
    with no_grad():
        return g(*operands).data


def _cond_vjp(g, xs, y, needs, true_graph, false_graph):
    pred, operands = xs[0], xs[1:]
    tg, fg = vjp_graph(true_graph), vjp_graph(false_graph)
    grads = [None]
    for i, need in enumerate(needs[1:]):
        if not need or not dtypes.is_float(operands[i].dtype):
            grads.append(None)
            continue
        grads.append(cond(pred, _pick(tg, i), _pick(fg, i), *operands, g))
    return tuple(grads)


def _pick(graph, i):
    def branch(*args):
        return graph(*args)[i]
    branch.__name__ = f"{graph.name}_{i}"
    return branch


def _cond_jvp(ts, xs, y, true_graph, false_graph):
    operands = xs[1:]
    tans = [t if t is not None else zeros_like(x) for t, x in zip(ts[1:], operands)]
    tg, fg = jvp_graph(true_graph), jvp_graph(false_graph)
    return cond(xs[0], lambda *a: tg(*a), lambda *a: fg(*a), *operands, *tans)


COND = defop("cond", compute=_cond_compute, infer=_cond_infer, vjp=_cond_vjp, jvp=_cond_jvp)


def cond(pred, true_fn, false_fn, *operands):
    """``true_fn(*operands) if pred else false_fn(*operands)``, as one graph node when traced.

    Eagerly, only the taken branch runs (and only it is on the tape: the dynamic graph). While
    tracing, both branches are traced into subgraphs and recorded in a ``cond`` node (the static
    graph); they must return tensors of the same shape and dtype.
    """
    ts = [as_tensor(o) for o in operands]
    p = as_tensor(pred)
    if not p.is_tracer and not any(t.is_tracer for t in ts):
        _check_pred(p)
        return as_tensor((true_fn if bool(p.data.reshape(())) else false_fn)(*ts))
    avals = [AVal(t.shape, t.dtype) for t in ts]
    tg = trace_branch(true_fn, avals, getattr(true_fn, "__name__", "true_fn"))
    fg = trace_branch(false_fn, avals, getattr(false_fn, "__name__", "false_fn"))
    return apply(COND, p, *ts, true_graph=tg, false_graph=fg)
