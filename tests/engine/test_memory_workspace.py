"""The memory planner books the scratch memory a selected kernel declares (``Kernel.workspace``):
one record per such node, live at that node's step only, so a compiled graph's plan (and its
peak) counts it; a declaration that is not a byte count is refused."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import memory
from mlsys_lab.engine.registry import REGISTRY, get, register_impl

NAME = "workspace_probe_double"


@pytest.fixture
def double():
    """A custom op whose only cpu kernel declares 1000 bytes of workspace per call."""
    op = ml.custom_op(NAME, compute=lambda x: x * 2, infer=lambda x: get("neg").infer(x),
                      replace=True)

    def run(out, x):
        np.multiply(x, 2, out=out)

    kernel = register_impl(NAME, "cpu", run, name="probe.scratch",
                           workspace=lambda avals, out, attrs: 1000)
    yield op, kernel
    del REGISTRY[NAME]


def test_a_declared_workspace_is_planned_at_its_nodes_step(double):
    op, kernel = double
    x = np.arange(4.0)
    c = ml.compile(lambda x: op(op(x) + 1.0), x)
    np.testing.assert_array_equal(c(x), (x * 2 + 1) * 2)
    steps = {n: i for i, n in enumerate(c.order)}
    spaces = [r for r in c.lifetimes if isinstance(r.id, memory.Workspace)]
    assert sorted(r.size for r in spaces) == [1000, 1000]
    for r in spaces:
        assert r.start == r.end == steps[r.id.producer]
        assert r.id.producer.meta["kernel"] is kernel and r.id.name.startswith("workspace#")
    memory.verify(c.plan, c.lifetimes)
    assert c.plan.arena_size >= 1000  # the peak includes the scratch
    without = memory.lifetimes(c.graph, c.order, include_inputs=False, workspace=False)
    assert not any(isinstance(r.id, memory.Workspace) for r in without)


def test_a_graph_without_selected_kernels_has_no_workspace(double):
    op, _ = double
    g = ml.trace(lambda x: op(x), np.arange(3.0))
    assert not any(isinstance(r.id, memory.Workspace) for r in memory.lifetimes(g))


def test_a_declaration_that_is_not_a_byte_count_is_refused(double):
    op, _ = double
    register_impl(NAME, "cpu", lambda out, x: None, name="probe.scratch",
                  workspace=lambda avals, out, attrs: -1)
    with pytest.raises(ml.GraphError, match="probe.scratch declares a workspace of -1"):
        ml.compile(lambda x: op(x), np.arange(3.0))
