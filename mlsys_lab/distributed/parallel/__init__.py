"""Parallel training as rank programs on the simulator (or MPI): data parallelism with gradient
buckets (``data_parallel``), a Linear split by columns or rows (``tensor_parallel``), GPipe and
1F1B schedules (``pipeline_parallel``), ZeRO's memory and sharded update (``zero``), FSDP with
per-layer gathers and prefetch (``fsdp``: ZeRO stage 3), a DP x TP x PP device mesh (``mesh``)
and failures with checkpoint-restart (``faults``).

The modules are re-exported by :mod:`mlsys_lab.distributed` under the same names
(``from mlsys_lab.distributed import data_parallel as dp``).
"""

from . import data_parallel, faults, fsdp, mesh, pipeline_parallel, tensor_parallel, zero
from .mesh import DeviceMesh

__all__ = ["DeviceMesh", "data_parallel", "faults", "fsdp", "mesh", "pipeline_parallel",
           "tensor_parallel", "zero"]

# Expert parallelism: an nn.MoE's experts over ranks, two all-to-alls per layer (ch. 19).
from . import expert  # noqa: E402

__all__ += ["expert"]

# The 3-D parallel planner: memory and step time of a GPT on a DP x TP x PP mesh (ch. 19).
from . import planner  # noqa: E402

__all__ += ["planner"]
