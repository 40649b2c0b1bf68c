"""Chapter 16, explainable AI (可解释性AI系统): ``solutions/ch16_explainable_ai.ipynb``."""
