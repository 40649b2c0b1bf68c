"""Chapter 16, explainable AI (可解释性AI系统): ``solutions/ch16_explainable_ai.ipynb``."""

from mlsys_lab.grading.exercises.ch16_explainable_ai import (  # noqa: F401
    ex16_1_integrated_gradients,
    ex16_2_kernelshap_weights,
    ex16_3_grad_cam,
)
