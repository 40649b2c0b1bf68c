"""mlsys_lab.distributed: a cluster simulator, collectives, parallel training, MPI (ch. 11).

    from mlsys_lab.distributed import sim, collectives
    cluster = sim.Cluster(sim.ring(8))
    res = sim.run(cluster, lambda comm, x: collectives.allreduce(comm, x), args=...)

Folders are concepts (``README.md`` maps each to its module and the book's section):
``sim/`` the discrete-event simulator (its public face in ``sim/__init__.py``, the event loop,
link sharing, the batched ring, the cluster's topology), ``collectives/`` the collectives and
their alpha-beta cost model, ``parallel/`` data / tensor / pipeline parallelism, ZeRO, the
device mesh and checkpoint-restart, ``ps/`` the parameter server; ``comm.py`` is the contract
both backends implement and ``mpi.py`` the MPI backend (imported on demand: it needs mpi4py).
The modules notebooks use keep their names here: ``sim``, ``collectives``, ``cost``,
``topology``, ``data_parallel``, ``tensor_parallel``, ``pipeline_parallel``, ``zero``, ``mesh``,
``faults``, ``param_server``.
"""

from . import collectives, sim
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    block_bounds,
    broadcast,
    cost,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .comm import (
    CommError,
    CommTimeoutError,
    Communicator,
    DeadlockError,
    DeviceFailure,
    LinkFailure,
)
from .sim import Cluster, SymbolicArray, run, topology

__all__ = [
    "Cluster", "CommError", "CommTimeoutError", "Communicator", "DeadlockError", "DeviceFailure",
    "LinkFailure", "SymbolicArray", "allgather", "allreduce", "alltoall", "barrier",
    "block_bounds", "broadcast", "collectives", "cost", "gather", "reduce", "reduce_scatter",
    "run", "scatter", "sim", "topology",
]

# Parallel training on the simulator (or MPI): data / tensor / pipeline parallel, a device mesh,
# ZeRO, fault injection with checkpoint-restart; the parameter server with row-sparse gradients.
from . import parallel, ps  # noqa: E402
from .parallel import (  # noqa: E402
    DeviceMesh,
    data_parallel,
    faults,
    mesh,
    pipeline_parallel,
    tensor_parallel,
    zero,
)
from .ps import RowSparse, param_server  # noqa: E402

__all__ += ["DeviceMesh", "RowSparse", "data_parallel", "faults", "mesh", "param_server",
            "parallel", "pipeline_parallel", "ps", "tensor_parallel", "zero"]

# FSDP (ZeRO stage 3 with per-layer gathers and prefetch; ``zero.zero_train(stage=3)`` runs it).
from .parallel import fsdp  # noqa: E402

__all__ += ["fsdp"]

# Expert parallelism (ch. 19): an nn.MoE's experts spread over ranks, two all-to-alls per layer.
from .parallel import expert  # noqa: E402

__all__ += ["expert"]

# The 3-D parallel planner (ch. 19): memory per GPU and step time of DP x TP x PP for a GPT.
from .parallel import planner  # noqa: E402

__all__ += ["planner"]
