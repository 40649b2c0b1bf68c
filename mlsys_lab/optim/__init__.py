"""Optimisers: ``ml.optim.SGD``, ``Adam``, ``RMSProp``, ``Adagrad``, ``SparseAdam`` (the last two
and SGD take row-sparse gradients); their state lives in ``state_dict()``."""

from .optimizers import SGD, Adagrad, Adam, Optimizer, RMSProp, SparseAdam

__all__ = ["Optimizer", "SGD", "Adam", "RMSProp", "Adagrad", "SparseAdam"]
