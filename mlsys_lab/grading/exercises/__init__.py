"""The exercises, one package per chapter and one module per exercise.

``CHAPTERS`` maps a chapter number to its package (named like its solution notebook,
``solutions/ch04_computational_graph.ipynb`` → ``ch04_computational_graph``). A chapter's
``__init__`` imports its exercise modules in order; each module holds one exercise whole: its
inputs, probes, judges, the wrong ideas its cases reject, and its ``register(Exercise(...))``.
``fixtures`` holds what several chapters share. ``ch00_demo`` is the template to copy.
"""

CHAPTERS = {
    0: "ch00_demo",
    2: "ch02_introduction",
    3: "ch03_programming_interface",
    4: "ch04_computational_graph",
    6: "ch06_compiler_frontend",
    7: "ch07_compiler_backend_runtime",
    8: "ch08_hardware_accelerators",
    9: "ch09_data_processing",
    10: "ch10_model_deployment",
    11: "ch11_distributed_training",
    13: "ch13_recommender_systems",
    14: "ch14_federated_learning",
    15: "ch15_reinforcement_learning",
    16: "ch16_explainable_ai",
    17: "ch17_robotic_systems",
    18: "ch18_llm_inference",
    19: "ch19_training_large_models",
}


def package_of(chapter: int) -> str | None:
    """The full module name of a chapter's exercise package, or None when it has none."""
    name = CHAPTERS.get(chapter)
    return f"{__name__}.{name}" if name else None
