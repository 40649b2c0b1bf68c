"""Chapter 10, model deployment (``solutions/ch10_model_deployment.ipynb``).

10.1 folding a batch norm into the conv / linear layer before it, checked exactly in float64;
10.2 a per-channel symmetric int8 quantiser calibrated over several batches; 10.3 magnitude
pruning to an exact sparsity target, global or per layer. ``common`` holds the judges' array
and exception checks.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references in float64 and decide,
and name the wrong idea an answer's numbers match where they can.
"""

from mlsys_lab.grading.exercises.ch10_model_deployment import (  # noqa: F401
    ex10_1_bn_fold,
    ex10_2_quantizer,
    ex10_3_pruning,
)
