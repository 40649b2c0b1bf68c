"""mlsys_lab.recsys: deep-learning recommender systems (book ch. 13).

Synthetic Zipf click logs, a small DLRM and a two-tower retriever on sparse embedding tables
(``ml.nn.EmbeddingBag(sparse=True)``), their metrics, the tables sharded over simulated
parameter servers with hot-row caches, a multi-stage retrieval -> ranking -> re-ranking funnel
with latency budgets, and model-update propagation from training to serving.
"""

from . import cache, data, funnel, metrics, models, sharding, updates
from .cache import LFUCache, LRUCache, hit_rate_curve, simulate_cache
from .data import ClickLog, Interactions, synthetic_click_log, synthetic_interactions, zipf_sampler
from .funnel import Funnel, FunnelStage, report_table
from .metrics import auc, log_loss, mean_recall_at_k, recall_at_k
from .models import DLRM, TwoTower, bce_with_logits, dot_interaction
from .sharding import (
    ShardedTables,
    balanced_placement,
    dense_allreduce_bytes,
    load_imbalance,
    replicated_loads,
    round_robin_placement,
    server_loads,
)
from .updates import simulate_propagation, transfer_time

__all__ = [
    "cache", "data", "funnel", "metrics", "models", "sharding", "updates",
    "LFUCache", "LRUCache", "hit_rate_curve", "simulate_cache",
    "ClickLog", "Interactions", "synthetic_click_log", "synthetic_interactions", "zipf_sampler",
    "auc", "log_loss", "mean_recall_at_k", "recall_at_k",
    "DLRM", "TwoTower", "bce_with_logits", "dot_interaction",
    "Funnel", "FunnelStage", "report_table",
    "ShardedTables", "balanced_placement", "dense_allreduce_bytes", "load_imbalance",
    "replicated_loads", "round_robin_placement", "server_loads",
    "simulate_propagation", "transfer_time",
]
