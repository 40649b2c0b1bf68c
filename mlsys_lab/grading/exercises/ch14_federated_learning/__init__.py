"""Chapter 14, federated learning (联邦学习系统): ``solutions/ch14_federated_learning.ipynb``."""
