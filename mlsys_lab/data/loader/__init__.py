"""The DataLoader (PyTorch semantics): datasets, samplers, collation, the loader and its worker
processes (book chapter 9). The modules, one idea each:

    dataset      Dataset, IterableDataset, TensorDataset, Subset, ConcatDataset, ChainDataset
    sampler      Sequential/Random/SubsetRandom/Distributed samplers, BatchSampler (resumable)
    collate      default_collate, default_convert
    dataloader   DataLoader: batches of indices out, batches back, in order, with timeouts
    worker       the worker processes: worker_loop, Fetcher, WorkerPool, the loader's errors
    shm          batches handed from a worker to the main process through shared memory

Everything public is re-exported by :mod:`mlsys_lab.data`.
"""

from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)
from .worker import (
    DataLoaderError,
    DataLoaderTimeoutError,
    WorkerCrashedError,
    WorkerError,
    WorkerInfo,
    get_worker_info,
)

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "DataLoaderError",
    "DataLoaderTimeoutError", "Dataset", "DistributedSampler", "IterableDataset", "RandomSampler",
    "Sampler", "SequentialSampler", "Subset", "SubsetRandomSampler", "TensorDataset",
    "WorkerCrashedError", "WorkerError", "WorkerInfo", "default_collate", "default_convert",
    "get_worker_info", "random_split",
]
