"""mlsys_lab.distributed: a cluster simulator, collectives, parallel training, MPI (ch. 11).

    from mlsys_lab.distributed import sim, collectives
    cluster = sim.Cluster(sim.ring(8))
    res = sim.run(cluster, lambda comm, x: collectives.allreduce(comm, x), args=...)

``mpi`` (the MPI backend) is imported on demand: it needs mpi4py.
"""

from . import collectives, cost, sim, topology
from .collectives import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    block_bounds,
    broadcast,
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
from .sim import Cluster, SymbolicArray, run

__all__ = [
    "Cluster", "CommError", "CommTimeoutError", "Communicator", "DeadlockError", "DeviceFailure",
    "LinkFailure", "SymbolicArray", "allgather", "allreduce", "alltoall", "barrier",
    "block_bounds", "broadcast", "collectives", "cost", "gather", "reduce", "reduce_scatter",
    "run", "scatter", "sim", "topology",
]

# Parallel training on the simulator (or MPI): data / tensor / pipeline parallel, a device mesh,
# ZeRO, a parameter server, fault injection with checkpoint-restart, row-sparse gradients.
from . import (  # noqa: E402
    data_parallel,
    faults,
    mesh,
    param_server,
    pipeline_parallel,
    sparse,
    tensor_parallel,
    zero,
)
from .mesh import DeviceMesh  # noqa: E402
from .sparse import RowSparse  # noqa: E402

__all__ += ["DeviceMesh", "RowSparse", "data_parallel", "faults", "mesh", "param_server",
            "pipeline_parallel", "sparse", "tensor_parallel", "zero"]
