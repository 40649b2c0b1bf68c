"""Chapter 13, recommender systems (``solutions/ch13_recommender_systems.ipynb``).

13.1 the row-sparse gradient of an embedding bag with respect to its table: only the touched
rows, each once, repeated ids accumulating, mean pooling dividing by each bag's own size;
13.2 Recall@k = TP / min(TP + FN, k); 13.3 a shard placement that spreads hot keys over the
servers without exceeding their capacity.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide.
"""

from mlsys_lab.grading.exercises.ch13_recommender_systems import (  # noqa: F401
    ex13_1_sparse_grad,
    ex13_2_recall,
    ex13_3_shard_placement,
)
