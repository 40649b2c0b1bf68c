"""Chapter 18, LLM inference (大模型推理): ``solutions/ch18_llm_inference.ipynb``."""

from mlsys_lab.grading.exercises.ch18_llm_inference import (  # noqa: F401
    ex18_1_online_softmax,
    ex18_2_kv_decode,
    ex18_3_speculative,
)
