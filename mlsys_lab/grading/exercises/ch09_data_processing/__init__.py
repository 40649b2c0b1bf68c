"""Chapter 9, data processing (``solutions/ch09_data_processing.ipynb``).

9.1 an order-preserving parallel map on threads, producer ``i`` of ``M`` owning items
``i + M*k``; 9.2 a shard-aware sampler with DistributedSampler's semantics; 9.3 a bottleneck
finder over the read rate, the stages, the shared CPUs and the consume rate. One module per
exercise (see ``ch00_demo`` for the layout); ``common`` holds the judges' type check they share.
"""

from mlsys_lab.grading.exercises.ch09_data_processing import (  # noqa: F401
    ex9_1_parallel_map,
    ex9_2_shard_sampler,
    ex9_3_bottleneck,
)
