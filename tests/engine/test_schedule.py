"""Kahn's algorithm and cycle reporting (mlsys_lab.engine.schedule)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.engine.schedule import in_degrees, kahn


def _cycle_of(nodes, edges):
    with pytest.raises(ml.CycleError) as info:
        kahn(nodes, edges)
    return info.value


def _is_cycle_of(cycle, edges):
    """The reported list is a closed walk along edges that visits each node once."""
    edge_set = set(edges)
    return (len(cycle) >= 2 and cycle[0] == cycle[-1] and len(set(cycle[:-1])) == len(cycle) - 1
            and all((a, b) in edge_set for a, b in zip(cycle, cycle[1:])))


# a -> b -> c -> a is a cycle; c -> d -> e is a tail hanging below it. Walking successors from a
# leftover node can step from c into the tail and get stuck at e (no successors).
CYCLE_WITH_TAIL = [("a", "b"), ("b", "c"), ("c", "d"), ("c", "a"), ("d", "e")]


@pytest.mark.parametrize("order", ["abcde", "edcba", "decab"])
def test_a_cycle_feeding_a_tail_raises_cycle_error_naming_the_cycle(order):
    err = _cycle_of(order, CYCLE_WITH_TAIL)
    assert isinstance(err, ml.GraphError) and isinstance(err, RuntimeError)
    assert _is_cycle_of(err.cycle, CYCLE_WITH_TAIL)
    assert set(err.cycle) == {"a", "b", "c"}          # the tail d, e is not on the cycle
    assert " -> ".join(err.cycle) in str(err)


def test_cycle_is_reported_in_edge_order_from_its_first_listed_node():
    err = _cycle_of("abcde", CYCLE_WITH_TAIL)
    assert err.cycle == ["a", "b", "c", "a"]
    assert "cycle a -> b -> c -> a" in str(err)


def test_a_self_loop_is_a_cycle_of_one_node():
    err = _cycle_of(["x", "y"], [("x", "y"), ("y", "y")])
    assert err.cycle == ["y", "y"]
    assert "y -> y" in str(err)


def test_two_cycles_report_one_real_cycle():
    edges = [("a", "b"), ("b", "a"), ("c", "d"), ("d", "c"), ("b", "e"), ("d", "e")]
    err = _cycle_of("abcde", edges)
    assert _is_cycle_of(err.cycle, edges)
    assert set(err.cycle) in ({"a", "b"}, {"c", "d"})
    assert "e" not in err.cycle


def test_sortable_nodes_before_a_cycle_are_not_reported():
    edges = [("s", "a"), ("a", "b"), ("b", "a")]
    err = _cycle_of("sab", edges)
    assert err.cycle == ["a", "b", "a"]


CHAIN = 100_000


def test_a_100000_node_chain_sorts_without_recursion():
    nodes = list(range(CHAIN))
    edges = [(i, i + 1) for i in range(CHAIN - 1)]
    assert kahn(reversed(nodes), edges) == nodes


def test_a_cycle_at_the_end_of_a_100000_node_chain_is_found():
    half = CHAIN // 2
    edges = [(i, i + 1) for i in range(CHAIN - 1)] + [(CHAIN - 1, half)]
    err = _cycle_of(range(CHAIN), edges)
    assert err.cycle[0] == half and err.cycle[-1] == half
    assert len(err.cycle) == CHAIN - half + 1
    assert _is_cycle_of(err.cycle, edges)


def test_edges_to_unknown_nodes_are_graph_errors():
    with pytest.raises(ml.GraphError, match="unknown node 'z'"):
        kahn("ab", [("a", "z")])
    with pytest.raises(ml.GraphError, match="unknown node 'z'"):
        kahn("ab", [("z", "a")])
    with pytest.raises(ml.GraphError, match="unknown node 'z'"):
        in_degrees("ab", [("a", "z")])


def test_edges_may_be_a_one_shot_iterator():
    edges = iter([("a", "d"), ("b", "c"), ("c", "d"), ("d", "e")])
    assert kahn("abcde", edges) == ["a", "b", "c", "d", "e"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30))))
def test_random_graphs_sort_or_report_a_real_cycle(case):
    n, edges = case
    nodes = list(range(n))
    try:
        order = kahn(nodes, edges)
    except ml.CycleError as err:
        assert _is_cycle_of(err.cycle, edges)
        return
    assert sorted(order) == nodes
    position = {v: i for i, v in enumerate(order)}
    assert all(position[s] < position[d] for s, d in edges)
