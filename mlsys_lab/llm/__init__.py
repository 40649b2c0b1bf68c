"""mlsys_lab.llm: large-language-model inference in miniature (book ch. 18).

A tiny GPT trained on Python's own documentation, a KV cache, a paged KV cache with
copy-on-write prefix sharing and a continuous-batching serving loop, a serving simulator against
static batching, speculative decoding with the exact rejection rule, and weight-only int8.
``README.md`` in this folder maps each idea to its module and the book's section.
"""

from . import (
    generate,
    kv_cache,
    model,
    paged,
    pretrained,
    quant,
    sampling,
    serving,
    simulator,
    speculative,
    text,
    tokenizer,
)
from .generate import decode_step_time, prefill_time
from .generate import generate as generate_tokens
from .kv_cache import KVCache, attend_mask
from .model import GPT, GPTConfig, attention, gelu
from .paged import BlockAllocator, PagedKVCache
from .pretrained import WEIGHTS, Pretrained, heldout_loss, load
from .quant import Int8Linear, quantize_weights
from .sampling import probabilities, sample, top_k_mask, top_p_mask
from .serving import Request, serve
from .simulator import CostModel, TraceRequest, measure_cost_model, poisson_trace, simulate
from .speculative import (
    acceptance_probability,
    expected_tokens,
    output_distribution,
    residual,
    speculative_generate,
    speedup,
    time_per_token,
    verify,
)
from .tokenizer import BPETokenizer, ByteTokenizer

__all__ = [
    "generate", "kv_cache", "model", "paged", "pretrained", "quant", "sampling", "serving",
    "simulator", "speculative", "text", "tokenizer",
    "decode_step_time", "generate_tokens", "prefill_time",
    "KVCache", "attend_mask", "GPT", "GPTConfig", "attention", "gelu",
    "BlockAllocator", "PagedKVCache", "WEIGHTS", "Pretrained", "heldout_loss", "load",
    "Int8Linear", "quantize_weights", "probabilities", "sample", "top_k_mask", "top_p_mask",
    "Request", "serve", "CostModel", "TraceRequest", "measure_cost_model", "poisson_trace",
    "simulate", "acceptance_probability", "expected_tokens", "output_distribution",
    "residual", "speculative_generate", "speedup", "time_per_token", "verify",
    "BPETokenizer", "ByteTokenizer",
]
