"""mlsys_lab.data: the data processing of book chapter 9, in its two designs.

``loader/`` is PyTorch's: datasets, samplers and a multi-process ``DataLoader``.
``pipeline/`` is tf.data's / MindSpore's: a ``Pipeline`` of operators with per-operator
parallelism, graph passes, an autotuner and a simulator. Shared by both: ``records`` (the
indexed record file), ``transforms`` (decode, resize, normalise, augment), ``item_rng`` (per-item
random generators) and ``datasets`` (real and synthetic data). ``README.md`` maps each concept
to its module and book section.

    from mlsys_lab.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, num_workers=2, seed=0)
    for xb, yb in loader:
        ...
"""

# --- loader half (PyTorch semantics): loader/ ---
from . import loader
from .loader import *  # noqa: F403  (the names loader/__init__.py lists in its __all__)

__all__ = list(loader.__all__)

# --- pipeline half (tf.data / MindSpore style): pipeline/; record files and transforms here ---
from . import datasets, records, transforms  # noqa: E402
from .pipeline import sim as pipeline_sim  # noqa: E402  (the name notebooks and exercises use)
from .pipeline.autotune import AUTOTUNE, choose_degrees, refine_degrees  # noqa: E402
from .pipeline.passes import fuse_maps, optimize, push_filters, vectorize_maps  # noqa: E402
from .pipeline.pipeline import (  # noqa: E402
    Pipeline,
    PipelineError,
    PipelineTimeout,
    autotune,
    measure_costs,
)
from .records import RecordError, RecordFile, RecordWriter, read_shard, write_sharded  # noqa: E402

__all__ += [
    "AUTOTUNE", "Pipeline", "PipelineError", "PipelineTimeout", "RecordError", "RecordFile",
    "RecordWriter", "autotune", "choose_degrees", "datasets", "fuse_maps", "measure_costs",
    "optimize", "pipeline_sim", "push_filters", "read_shard", "records", "refine_degrees",
    "transforms", "vectorize_maps", "write_sharded",
]
