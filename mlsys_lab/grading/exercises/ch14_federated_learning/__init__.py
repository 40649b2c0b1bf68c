"""Chapter 14, federated learning (联邦学习系统): ``solutions/ch14_federated_learning.ipynb``."""

from mlsys_lab.grading.exercises.ch14_federated_learning import (  # noqa: F401
    ex14_1_weighted_aggregation,
    ex14_2_pairwise_masks,
    ex14_3_blind_psi,
)
