"""Chapter 4, the computational graph (``solutions/ch04_computational_graph.ipynb``).

4.1 Kahn's topological sort with cycle detection, 4.2 classifying dependencies between nodes of a
traced graph, 4.3 unrolling a loop body into fresh nodes, 4.4 the chain rule by hand on a
two-layer network with a tanh hidden layer (a variant the chapter does not work out).

Probes run the student's code and return plain data: orders, labels, and graphs as tables of
values and nodes (``fixtures.graph_data``). Judges rebuild the inputs from the seed, compute the
reference with the library (``kahn``, ``Graph.dependency``, ``ml.grad``) and rebuild the
student's graph (``fixtures.graph_from_data``) to lint and run it themselves.
"""

from mlsys_lab.grading.exercises.ch04_computational_graph import (  # noqa: F401
    ex4_1_toposort,
    ex4_2_classify,
    ex4_3_unroll,
    ex4_4_chain_rule,
)
