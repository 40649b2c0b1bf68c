"""Two fixes found while building chapter 10: a replaced child keeps its place in a Sequential
(the passes that swap layers depend on the order), and Graph.lint turns an op rule's crash on
garbage attributes into a GraphError naming the node instead of a raw TypeError."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.errors import GraphError


def _model():
    return nn.Sequential(nn.Linear(4, 5, rng=0), nn.ReLU(), nn.Linear(5, 3, rng=1))


def test_replacing_a_child_keeps_its_position_in_a_sequential():
    model = _model()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    setattr(model, "1", nn.Tanh())
    assert list(dict(model.named_children())) == ["0", "1", "2"]
    assert [type(m).__name__ for m in model] == ["Linear", "Tanh", "Linear"]
    want = model[2](ml.tensor(np.tanh(model[0](ml.tensor(x)).numpy()))).numpy()
    np.testing.assert_allclose(model(ml.tensor(x)).numpy(), want, rtol=1e-6)
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_replacing_a_parameter_keeps_the_state_dict_order():
    lin = nn.Linear(3, 2, rng=0)
    names = list(lin.state_dict())
    lin.weight = ml.nn.Parameter(np.zeros((2, 3), np.float32))
    assert list(lin.state_dict()) == names
    assert np.all(lin.state_dict()["weight"] == 0)


def test_a_child_replaced_by_a_plain_value_leaves_the_registry():
    model = _model()
    object_count = len(model._modules)
    model.__setattr__("1", 7)
    assert "1" not in dict(model.named_children()) and len(model._modules) == object_count - 1


@pytest.mark.parametrize("attrs", [{"stride": "abc"}, {"bogus": 1}, {"stride": None}])
def test_lint_reports_garbage_attrs_as_a_graph_error(attrs):
    x = np.zeros((1, 1, 5, 5), np.float32)
    w = np.zeros((2, 1, 3, 3), np.float32)
    graph = ml.trace(lambda a, b: ml.ops.conv2d(a, b), x, w)
    node = next(n for n in graph.nodes if n.op == "conv2d")
    node.attrs = dict(node.attrs, **attrs)
    with pytest.raises(GraphError, match="conv2d"):
        graph.lint()
