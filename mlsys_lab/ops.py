"""Every op of mlsys_lab as a function: ``ml.ops.relu(x)``, ``ml.ops.conv2d(img, w, padding=1)``.

Each is defined once in the op registry (``mlsys_lab.engine.registry.defop``) and serves eager
mode, tracing, autodiff and the compiler passes alike. ``ml.custom_op`` defines a new one the same
way.
"""

from .engine.control import cond
from .engine.ops_attention import scaled_dot_product_attention
from .engine.ops_embedding import embedding, embedding_bag  # noqa: F401 - registers the ops
from .engine.ops_math import (
                              abs,
                              add,
                              cast,
                              cos,
                              div,
                              eq,
                              exp,
                              ge,
                              gt,
                              le,
                              log,
                              lt,
                              maximum,
                              minimum,
                              mul,
                              ne,
                              neg,
                              pow,
                              relu,
                              sigmoid,
                              sign,
                              sin,
                              sqrt,
                              sub,
                              tanh,
                              where,
)
from .engine.ops_nn import (
                              avg_pool2d,
                              batch_norm,
                              conv2d,
                              cross_entropy,
                              dropout,
                              get_rng_state,
                              layer_norm,
                              log_softmax,
                              manual_seed,
                              max_pool2d,
                              mse_loss,
                              one_hot,
                              rng_seed,
                              set_rng_state,
                              softmax,
)
from .engine.ops_shape import (
                              argmax,
                              broadcast_to,
                              concatenate,
                              getitem,
                              identity,
                              matmul,
                              max,
                              mean,
                              pad,
                              reshape,
                              stack,
                              sum,
                              take,
                              transpose,
)

__all__ = [
    "abs", "add", "argmax", "avg_pool2d", "batch_norm", "broadcast_to", "cast", "concatenate",
    "cond", "conv2d", "cos", "cross_entropy", "div", "dropout", "embedding", "eq", "exp", "ge",
    "get_rng_state", "getitem", "gt", "identity", "layer_norm", "le", "log", "log_softmax", "lt",
    "manual_seed", "set_rng_state",
    "matmul", "max", "max_pool2d", "maximum", "mean", "minimum", "mse_loss", "mul", "ne", "neg",
    "one_hot", "pad", "pow", "relu", "reshape", "rng_seed", "scaled_dot_product_attention",
    "sigmoid", "sign", "sin", "softmax",
    "sqrt", "stack", "sub", "sum", "take", "tanh", "transpose", "where",
]
