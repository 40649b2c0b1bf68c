"""mlsys_lab.data: datasets, samplers and a multi-process DataLoader with PyTorch's semantics
(book chapter 9).

    from mlsys_lab.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, num_workers=2, seed=0)
    for xb, yb in loader:
        ...
"""

# --- loader half (PyTorch semantics) ---
from ._worker import (
    DataLoaderError,
    DataLoaderTimeoutError,
    WorkerCrashedError,
    WorkerError,
    WorkerInfo,
    get_worker_info,
)
from .collate import default_collate, default_convert
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .loader import DataLoader
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "DataLoaderError",
    "DataLoaderTimeoutError", "Dataset", "DistributedSampler", "IterableDataset", "RandomSampler",
    "Sampler", "SequentialSampler", "Subset", "SubsetRandomSampler", "TensorDataset",
    "WorkerCrashedError", "WorkerError", "WorkerInfo", "default_collate", "default_convert",
    "get_worker_info", "random_split",
]

# --- pipeline half (tf.data / MindSpore style): Pipeline, data-graph passes, record files ---
from . import datasets, pipeline_sim, records, transforms  # noqa: E402
from .autotune import AUTOTUNE, choose_degrees, refine_degrees  # noqa: E402
from .pipeline import (  # noqa: E402
    Pipeline,
    PipelineError,
    PipelineTimeout,
    autotune,
    measure_costs,
)
from .pipeline_passes import fuse_maps, optimize, push_filters, vectorize_maps  # noqa: E402
from .records import RecordError, RecordFile, RecordWriter, read_shard, write_sharded  # noqa: E402

__all__ += [
    "AUTOTUNE", "Pipeline", "PipelineError", "PipelineTimeout", "RecordError", "RecordFile",
    "RecordWriter", "autotune", "choose_degrees", "datasets", "fuse_maps", "measure_costs",
    "optimize", "pipeline_sim", "push_filters", "read_shard", "records", "refine_degrees",
    "transforms", "vectorize_maps", "write_sharded",
]
