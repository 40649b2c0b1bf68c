"""Layers, losses and initialisers: ``ml.nn.Linear(784, 256)``, ``ml.nn.Sequential(...)``."""

from . import init
from .attention import CausalSelfAttention, MultiheadAttention
from .embedding import Embedding, EmbeddingBag
from .layers import (
                     AvgPool2d,
                     BatchNorm2d,
                     Conv2d,
                     Dropout,
                     Flatten,
                     LayerNorm,
                     Linear,
                     MaxPool2d,
                     ReLU,
                     Sequential,
                     Sigmoid,
                     Tanh,
                     cross_entropy,
                     mse_loss,
)
from .module import Module, Parameter, functional_call

__all__ = ["Module", "Parameter", "functional_call", "init", "Linear", "Conv2d", "BatchNorm2d",
           "LayerNorm", "EmbeddingBag",
           "Embedding", "ReLU", "Tanh", "Sigmoid", "Dropout", "Flatten", "MaxPool2d",
           "AvgPool2d", "Sequential", "cross_entropy", "mse_loss", "MultiheadAttention",
           "CausalSelfAttention"]

# Mixture of experts (chapter 19): top-k gating with capacity and Switch's load-balancing loss.
from .moe import MoE, Routing, route_top_k  # noqa: E402

__all__ += ["MoE", "Routing", "route_top_k"]
