"""Optimisers: ``ml.optim.SGD``, ``Adam``, ``RMSProp``; their state lives in ``state_dict()``."""

from .optimizers import SGD, Adam, Optimizer, RMSProp

__all__ = ["Optimizer", "SGD", "Adam", "RMSProp"]
