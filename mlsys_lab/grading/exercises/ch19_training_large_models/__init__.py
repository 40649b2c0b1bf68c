"""Chapter 19, training large models (大模型训练).

The exercise set is ``solutions/ch19_training_large_models.ipynb``.
"""

from mlsys_lab.grading.exercises.ch19_training_large_models import (  # noqa: F401
    ex19_1_recompute,
    ex19_2_fsdp_schedule,
    ex19_3_topk_routing,
)
