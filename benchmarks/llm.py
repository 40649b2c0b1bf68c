"""LLM inference (book chapter 18): attention kernels, the KV cache, paged serving against static
batching, speculative decoding, weight-only int8 — side by side in one run.

    python benchmarks/llm.py [--quick] [--threads 1]
    python benchmarks/llm.py --gpu      # the CUDA attention kernel on a real GPU only: writes
                                        # benchmarks/results/gpu_attention.json, exits 2 without one

Prints:

1. **Attention** — the rows of ``benchmarks/llm_attention.py``'s ``attention_rows()`` (tiled
   online-softmax kernels against PyTorch and exact numpy), when that file is present.
2. **KV cache** — the committed tiny GPT (``mlsys_lab.llm.load()``; 4 layers, d = 128, context
   256) generates 255 tokens after a 1-token prompt, filling its context, greedily, for a batch
   of 1 and of 8 sequences: with the KV cache, and recomputing the whole prefix for every
   token. Both run the same eager no-grad model code and must give the same tokens. Then the
   same for a wider GPT of the benchmark's own shape (``BIG``: d = 256, 4 layers, context 512,
   seeded random weights: the work the cache saves does not depend on what the weights say),
   batch 1, 511 tokens. Target: cache >= 10x faster. The tiny GPT at batch 1 stays below it:
   one cached step there is ~70 eager ops of ~20 us each, so dispatch, not arithmetic, sets
   the cached path's time, and recomputing a 128-token prefix costs only ~4 such steps.
3. **Serving** — a step-cost model fitted to the GPT's measured cached decode steps (batch 1, 4,
   16 x context 16, 64, 128; each the fastest of 1.5 s of calls) and prompt runs (64, 256),
   and a seeded trace (Poisson arrivals at 1.5x the paged server's estimated capacity;
   prompts uniform in 16-512 tokens; outputs geometric with mean 128, capped at 512; 400
   requests, seed 0) served by static batching, continuous batching with contiguous
   max-length (1024) reservation and continuous + paged (block 16), all with the same KV
   memory: 16,384 token positions; paged admission keeps 5 % of the blocks free (vLLM's 1 %
   preempted and recomputed 51 requests in one run, 7 % less throughput). Targets: paged >= 2x
   static's throughput, paged KV waste <= 4 %.
4. **Speculative decoding** — the GPT as target; as drafts its first block, and its first two
   (with the shared embeddings, final norm and head: the training's early exit); gamma = 2, 3,
   4; sampling at temperature 1 from 12 held-out prompts (160 new tokens each: 430-690 steps
   per row, so the tokens a step emits, and with them the speed-up, carry a sampling error of
   1-3 %, printed as ``+-2se``). Measured acceptance alpha (mean of sum min(p, q)), cost ratio
   c (a draft forward in the run / a plain cached step), speed-up over plain cached decoding
   against the formula ``(1 - alpha^(gamma+1)) / ((1 - alpha)(c gamma + 1))``. Target: within
   10 %. (The training taught the first block's exit only, so the two-block draft costs more
   and agrees less: it shows that the gap to the formula does not depend on the draft:
   checking gamma + 1 tokens costs more than the one step the formula assumes,
   ``T_verify/T``. With 4 prompts, as before, the tokens per step fell 3 % short of the
   formula's in some runs and not in others: sampling noise, not a property of the rule.)
5. **Weight-only int8** — held-out loss and perplexity of the float32 model and of its int8
   per-channel copy, the logit change, the weight bytes.

Times are best-of / single runs on a shared 2-core machine (the load average is printed); after
the attention section BLAS (numpy's and SciPy's) runs ``--threads`` threads (default 1).
"""

import argparse
import itertools
import os
import sys
import time

import numpy as np

import mlsys_lab as ml
from mlsys_lab import llm, timing
from mlsys_lab.llm import simulator, speculative, text

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # llm_attention, beside this file
KV_TOKENS, MAX_LEN, BLOCK = 16384, 1024, 16
BIG = llm.GPTConfig(context=512, layers=4, dim=256, heads=4)
WATERMARK = 0.05  # paged admission keeps 5 % of the blocks free (1 %: 51 preemptions, -7 %)


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def attention_section(quick):
    try:
        from llm_attention import attention_rows
    except ImportError as e:
        print(f"(benchmarks/llm_attention.py not available: {e})")
        return
    try:
        attention_rows(repeats=2 if quick else 5)  # prints its own table
    except Exception as e:  # noqa: BLE001 - the other sections still run
        print(f"(attention_rows failed: {type(e).__name__}: {e})")


def greedy_batch(model, batch, new_tokens, use_cache):
    """Greedy decoding of ``batch`` sequences from one-token prompts to ``new_tokens`` more."""
    ids = np.arange(batch)[:, None] % model.config.vocab_size
    cache = llm.KVCache(model.config, batch) if use_cache else None
    feed = ids
    for _ in range(new_tokens):
        logits = model(feed, cache) if use_cache else model(ids)
        nxt = np.argmax(logits.numpy()[:, -1], axis=-1)[:, None]
        ids = np.concatenate([ids, nxt], axis=1)
        feed = nxt
    return ids


def kv_cache_section(model, new_tokens, batches, rounds):
    """Each batch size: ``rounds[b]`` interleaved rounds of both paths, the fastest kept."""
    print(f"{'batch':>5}  {'path':<22}{'tokens':>8}{'seconds':>10}{'ms/step':>10}"
          f"{'speed-up':>10}")
    for b in batches:
        t_cache = t_plain = float("inf")
        for _ in range(rounds.get(b, 1)):
            cached, t = timing.timed(greedy_batch, model, b, new_tokens, True)
            t_cache = min(t_cache, t)
            plain, t = timing.timed(greedy_batch, model, b, new_tokens, False)
            t_plain = min(t_plain, t)
        same = np.array_equal(cached, plain)
        print(f"{b:>5}  {'recompute the prefix':<22}{b * new_tokens:>8}{t_plain:>10.2f}"
              f"{1e3 * t_plain / new_tokens:>10.2f}")
        print(f"{b:>5}  {'KV cache':<22}{b * new_tokens:>8}{t_cache:>10.2f}"
              f"{1e3 * t_cache / new_tokens:>10.2f}{t_plain / t_cache:>9.1f}x   "
              f"same tokens: {same}")
    print("target: KV cache >= 10x faster (both paths: the same eager no-grad model code; "
          "best of interleaved rounds: " + ", ".join(f"batch {b}: {rounds.get(b, 1)}"
                                                     for b in batches) + ")")


def serving_section(model, requests, quick):
    cost, data = simulator.measure_cost_model(
        model, batch_sizes=(1, 4, 16), contexts=(16, 64, 128), prefill=(64, 256),
        repeats=2 if quick else 7, budget=0.0 if quick else 1.5)
    print("cost model (fitted to measured steps): "
          f"{1e3 * cost.base:.2f} ms + {1e3 * cost.per_seq:.3f} ms/sequence + "
          f"{1e6 * cost.per_context:.3f} us/context token + {1e6 * cost.per_prefill:.1f} "
          f"us/prompt token")
    print("measured decode steps (batch, context, ms): " + ", ".join(
        f"({b},{L},{1e3 * t:.2f})" for b, L, t in data["decode"]))
    rate = 1.5 * simulator.capacity_rate(cost, KV_TOKENS // 400)
    trace = llm.poisson_trace(requests, rate=rate, seed=0)
    print(f"trace: {requests} requests, Poisson at {rate:.1f}/s, prompts U[16, 512], outputs "
          f"geometric mean 128 (cap 512), seed 0; KV memory {KV_TOKENS} positions "
          f"({KV_TOKENS * model.config.kv_bytes_per_token() / 2**20:.0f} MiB of this GPT's "
          f"K/V), block {BLOCK}, max_len {MAX_LEN}, paged admission watermark "
          f"{100 * WATERMARK:.0f} % of the blocks")
    print(f"{'policy':<24}{'tok/s':>9}{'p50 s':>9}{'p99 s':>9}{'KV waste':>10}"
          f"{'batch':>8}{'preempt':>9}")
    results = {}
    for policy in simulator.POLICIES:
        r = llm.simulate(trace, policy, KV_TOKENS, cost, block_size=BLOCK, max_len=MAX_LEN,
                         watermark=WATERMARK)
        results[policy] = r
        name = {"static": "static", "contiguous": "continuous, contiguous",
                "paged": "continuous + paged"}[policy]
        print(f"{name:<24}{r.throughput:>9.0f}{r.p50_latency:>9.2f}{r.p99_latency:>9.2f}"
              f"{100 * r.waste:>9.1f}%{r.mean_batch:>8.1f}{r.preemptions:>9}")
    ratio = results["paged"].throughput / results["static"].throughput
    print(f"paged / static throughput {ratio:.2f}x (target >= 2x); paged KV waste "
          f"{100 * results['paged'].waste:.1f} % (target <= 4 %)")


def speculative_section(model, prompts, new_tokens, gammas, rounds, drafts=(1, 2)):
    """Each round runs plain decoding and, for every draft (the target's first ``layers``
    blocks) and gamma, speculative decoding on every prompt, interleaved, so load drift hits
    all alike; the fastest round of each contestant is kept."""
    models = {layers: model.truncated(layers) for layers in drafts}
    best = {}
    for _ in range(rounds):
        runs = {"plain": [0.0, {}]}
        for i, p in enumerate(prompts):
            _, t = timing.timed(llm.generate_tokens, model, p, new_tokens, 1.0, None, None, i)
            runs["plain"][0] += t
            for layers, g in itertools.product(drafts, gammas):
                (_, st), t = timing.timed(speculative.speculative_generate, model,
                                          models[layers], p, new_tokens, g, 1.0, i)
                total = runs.setdefault((layers, g), [0.0, {}])
                total[0] += t
                for k, v in st.items():
                    total[1].setdefault(k, []).append(v)
        for k, v in runs.items():
            if k not in best or v[0] < best[k][0]:
                best[k] = v
    tokens = len(prompts) * new_tokens
    T = best["plain"][0] / tokens
    print(f"plain cached decoding T = {1e3 * T:.2f} ms/token (target = the 4-block GPT, draft = "
          f"its first block or two); {len(prompts)} held-out prompts of 32 tokens, {new_tokens} "
          f"new tokens each, temperature 1, best of {rounds} interleaved rounds")
    print(f"{'draft':>7}{'gamma':>6}{'alpha':>7}{'c':>7}{'tok/step':>9}{'formula':>8}"
          f"{'ms/tok':>8}{'speed-up':>9}{'formula':>8}{'ratio':>7}{'+-2se':>7}"
          f"{'  | T_verify/T':>13}{'refined':>8}")
    for layers, g in itertools.product(drafts, gammas):
        seconds, st = best[(layers, g)]
        steps, accepted = sum(st["steps"]), sum(st["accepted"])
        alpha = float(np.mean(st["alpha"]))
        c = sum(st["draft_seconds"]) / (steps * g) / T  # one draft forward, in target steps
        verify = sum(st["target_seconds"]) / steps / T  # one verification, in target steps
        measured = T / (seconds / tokens)
        formula = speculative.speedup(alpha, g, c)
        refined = speculative.expected_tokens(alpha, g) / (c * g + verify)
        # The speed-up is proportional to the tokens a step emits: its standard error over
        # the kept round's steps bounds the noise the acceptance draws put in the ratio.
        per_step = np.concatenate(st["step_tokens"])
        spread = 2 * per_step.std(ddof=1) / np.sqrt(per_step.size) / per_step.mean()
        print(f"{layers:>2} blk{'s' if layers > 1 else ' '}{g:>6}{alpha:>7.3f}{c:>7.3f}"
              f"{(accepted + steps) / steps:>9.2f}"
              f"{speculative.expected_tokens(alpha, g):>8.2f}{1e3 * seconds / tokens:>8.2f}"
              f"{measured:>9.2f}{formula:>8.2f}{measured / formula:>7.3f}"
              f"{spread * measured / formula:>7.3f}{verify:>13.2f}{refined:>8.2f}")
    print("formula: (1 - a^(g+1)) / ((1 - a)(c g + 1)), c measured in the run; target: ratio "
          "0.90-1.10. +-2se: two standard errors of the ratio from the tokens per step (the "
          "steps' spread over sqrt(steps)). refined: the same with the verification's measured "
          "cost in place of T (the book's formula assumes checking g + 1 tokens costs one step; "
          "here it costs T_verify, and the share of a step it takes grows as the draft gets "
          "cheaper)")


def int8_section(pre, held, windows):
    model = pre.model
    q = llm.quantize_weights(model)
    ctx = model.config.context
    f32 = llm.heldout_loss(model, held, ctx, windows)
    i8 = llm.heldout_loss(q, held, ctx, windows)
    diff = llm.quant.compare_logits(model, q, held[None, :ctx])
    print(f"{'weights':<22}{'bytes':>12}{'held-out loss':>15}{'perplexity':>12}")
    print(f"{'float32':<22}{llm.quant.weight_bytes(model):>12,}{f32:>15.4f}{np.exp(f32):>12.2f}")
    print(f"{'int8 per channel':<22}{llm.quant.weight_bytes(q):>12,}{i8:>15.4f}{np.exp(i8):>12.2f}")
    print(f"logit change: max |d| {diff['max_abs']:.4f}, relative RMS {diff['rel_rms']:.2e}; "
          f"loss change {i8 - f32:+.6f} nats/token")
    meta = pre.meta
    print(f"(the committed weights are float16: training recorded a float32 held-out loss of "
          f"{meta['heldout_loss']:.6f} and {meta.get('float16_heldout_loss', float('nan')):.6f} "
          f"after rounding to float16, max logit change "
          f"{meta.get('float16_max_logit_change', float('nan')):.4f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weights", default=llm.WEIGHTS, help="a file the training wrote")
    parser.add_argument("--gpu", action="store_true",
                        help="only time the CUDA attention kernel on a real GPU "
                             "(benchmarks/llm_attention.py --gpu: writes its results file)")
    args = parser.parse_args()
    if args.gpu:
        import llm_attention

        llm_attention.main(["--gpu"] + (["--quick"] if args.quick else []))
        return
    print(f"# LLM inference benchmark ({load()})")
    print("\n## 1. attention (every contender on both cores, as llm_attention.py runs them)")
    with ml.no_grad():
        attention_section(args.quick)
    with ml.limit_threads(blas=args.threads), ml.no_grad():  # numpy's BLAS and SciPy's
        pre = llm.load(args.weights)
        model = pre.model
        held = text.split(llm.pretrained.encode_corpus(pre.tokenizer))[1]
        print(f"\n## 2. KV cache vs recompute ({load()})")
        kv_cache_section(model, model.config.context - 1, (1, 8),
                         {1: 1 if args.quick else 3})
        print(f"\n{BIG} (seeded random weights):")
        kv_cache_section(llm.GPT(BIG, seed=0), BIG.context - 1, (1,), {1: 1 if args.quick else 2})
        print(f"\n## 3. serving simulator ({load()})")
        serving_section(model, 150 if args.quick else 400, args.quick)
        print(f"\n## 4. speculative decoding ({load()})")
        n = 2 if args.quick else 12
        prompts = [held[i * 500: i * 500 + 32] for i in range(n)]
        speculative_section(model, prompts, 96 if args.quick else 160,
                            (2, 4) if args.quick else (2, 3, 4), 1 if args.quick else 2)
        print(f"\n## 5. weight-only int8 ({load()})")
        int8_section(pre, held, 4 if args.quick else None)
    print(f"\ndone ({load()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
    main()
