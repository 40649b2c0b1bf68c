"""Model compression besides quantisation (book ch. 10, model compression).

* :mod:`.prune` — magnitude pruning (unstructured masks, global or per layer), structured
  channel pruning of a conv/BN/linear stack, and a CSR sparse matrix with a Numba kernel;
* :mod:`.distill` — knowledge distillation: the softened-teacher loss and a training loop.

Quantisation, the other compression of the chapter, is :mod:`mlsys_lab.deploy.quant`.
"""

from . import distill, prune
from .distill import distillation_loss
from .prune import CSRMatrix, csr_matmul, magnitude_masks, prune_channels

__all__ = ["CSRMatrix", "csr_matmul", "distill", "distillation_loss", "magnitude_masks", "prune",
           "prune_channels"]
