"""The data pipeline on an image augment chain: decode → resize → rotate → normalise → HWC→CHW.

    python benchmarks/data_pipeline.py [--quick] [--images 512] [--size 64] [--budget 2]

Sections (each prints a table of interleaved best-of-N times and ratios against a named
baseline measured in the same run; timings on a shared machine are noisy):

* fusion       — the five maps unfused vs fused by ``fuse_maps`` (inline, and 2 threads each)
* vectorise    — per-item maps then ``batch`` vs ``vectorize_maps``: ``batch`` then the batched
                 forms (target >= 2x on the augment chain)
* autotune-sim — per-item stage costs measured here, then on the simulator with 16 shared
                 cores: the book's degrees (3, 2, 4, 3, 1), the model's, the autotuner's (the
                 model's choice corrected by climbing on simulated throughput), and the best
                 found by a wider search
* autotune     — measured here: a pipeline whose stages differ in cost, the autotuner's degrees
                 (model, then climbing on measured throughput) vs every hand-picked allocation
                 (``--budget`` CPUs, up to twice as many threads)
* ordered      — order-preserving vs unordered parallel map on items of varying cost, measured
                 and on the simulator
"""

from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

from mlsys_lab import timing
from mlsys_lab.data import pipeline_sim as sim
from mlsys_lab.data.datasets import synthetic_images
from mlsys_lab.data.pipeline.autotune import (
    brute_force,
    choose_degrees,
    predicted_throughput,
    refine_degrees,
)
from mlsys_lab.data.pipeline.passes import fuse_maps, vectorize_maps
from mlsys_lab.data.pipeline.pipeline import Pipeline, autotune, measure_costs, with_degrees
from mlsys_lab.data.transforms import (
    Decode,
    HWCToCHW,
    Normalize,
    RandomRotation,
    Resize,
    decode_png,
    random_rotation,
    resize,
)

STAGES = ("decode", "resize", "rotate", "normalize", "hwc_to_chw")


def augment_ops(out_size=32):
    return [("decode", Decode(), {}), ("resize", Resize(out_size), {}),
            ("rotate", RandomRotation(15), {"seed": 1}), ("normalize", Normalize(), {}),
            ("hwc_to_chw", HWCToCHW(), {})]


def records(n, size, seed=0):
    encoded, labels = synthetic_images(n, size=size, seed=seed)
    return [{"image": e, "label": int(k)} for e, k in zip(encoded, labels)]


def chain(items, ops, parallel=None, batch=64, deterministic=True):
    pipe = Pipeline.from_iterable(items)
    for name, fn, extra in ops:
        pipe = pipe.map(fn, field="image", num_parallel=parallel, name=name,
                        deterministic=deterministic, **extra)
    return pipe.batch(batch)


def same_output(a: Pipeline, b: Pipeline) -> bool:
    return all(np.array_equal(x["image"], y["image"]) and np.array_equal(x["label"], y["label"])
               for x, y in zip(a.to_list(), b.to_list()))


def show(title, table, note=""):
    print(f"\n== {title}")
    print(table)
    if note:
        print(note)


def fusion(args, items):
    ops = augment_ops()
    pipes = {"unfused, inline": chain(items, ops), "fused, inline": fuse_maps(chain(items, ops)),
             "unfused, 2 threads/map": chain(items, ops, 2),
             "fused, 2 threads": fuse_maps(chain(items, ops, 2))}
    assert same_output(pipes["unfused, inline"], pipes["fused, 2 threads"])
    result = timing.compare({k: p.run for k, p in pipes.items()}, rounds=args.rounds)
    show("map+map fusion (5 maps -> 1)", result,
         f"fused vs unfused: inline {result.speedup('fused, inline'):.2f}x, with threads "
         f"{result['unfused, 2 threads/map'] / result['fused, 2 threads']:.2f}x")


def vectorise(args, items):
    decoded = [{"image": decode_png(r["image"]), "label": r["label"]} for r in items]
    floats = [{"image": resize(r["image"], 32).astype(np.float32), "label": r["label"]}
              for r in decoded]
    chains = {"augment": (decoded, augment_ops()[1:]), "decode+augment": (items, augment_ops()),
              "normalize+chw (32x32)": (floats, augment_ops()[3:])}
    contestants = {}
    for name, (source, ops) in chains.items():
        per_item, batched = chain(source, ops), vectorize_maps(fuse_maps(chain(source, ops)))
        assert same_output(per_item, batched)
        contestants[f"per-item {name}"], contestants[f"batched {name}"] = per_item.run, batched.run
    result = timing.compare(contestants, rounds=args.rounds)
    gain = {name: result[f"per-item {name}"] / result[f"batched {name}"] for name in chains}
    show("map+batch vectorisation (batch 64)", result,
         f"vectorised vs per-item: augment (resize, rotate, normalise, CHW) {gain['augment']:.2f}x"
         f" (target >= 2x); with decode {gain['decode+augment']:.2f}x; cheap tail only "
         f"(normalise, CHW) {gain['normalize+chw (32x32)']:.2f}x")


def measured_costs(items, sample):
    costs = measure_costs(chain(items, augment_ops()), sample)
    return {name: costs[name] for name in STAGES}


def autotune_sim(args, items, cores=16):
    costs = measured_costs(items, min(len(items), 256))
    stages = lambda degrees: [sim.SimStage(n, costs[n], degrees[n]) for n in STAGES]
    run = lambda degrees: sim.simulate(stages(degrees), args.sim_items, cores=cores)
    rate = lambda degrees: run(degrees).throughput
    model = choose_degrees(costs, cores, cores=cores)
    tuned, tried = refine_degrees(model, cores, rate, rounds=3)  # the tuner: model + climbing
    # the baseline search is wider than the tuner's: the model's 24 best allocations and a
    # climb from each of 6 random starts, every candidate simulated
    candidates = _top_allocations(costs, cores, cores, keep=24)
    rng = np.random.default_rng(0)
    for _ in range(6):
        cut = np.sort(rng.choice(np.arange(1, cores), len(STAGES) - 1, replace=False))
        start = dict(zip(STAGES, np.diff([0, *cut, cores]).tolist()))
        candidates.append(refine_degrees(start, cores, rate, rounds=8)[0])
    searched = max((rate(d), tuple(d.values())) for d in candidates)
    book, auto, ideal = run(sim.BOOK_DEGREES), run(tuned), run(model)
    print(f"\n== autotuner on the simulator ({cores} cores shared by every worker, per-item "
          "costs measured here, us: " + ", ".join(f"{n} {c * 1e6:.0f}" for n, c in costs.items())
          + ")")
    print(f"  book degrees {tuple(sim.BOOK_DEGREES.values())}: {book.throughput:9.0f} items/s, "
          f"bottleneck {book.bottleneck}")
    print(f"  model only   {tuple(model.values())}: {ideal.throughput:9.0f} items/s "
          f"(the model predicts {predicted_throughput(costs, model, cores):.0f})")
    print(f"  autotuned    {tuple(tuned.values())}: {auto.throughput:9.0f} items/s, "
          f"bottleneck {auto.bottleneck} ({len(tried)} allocations simulated while climbing)")
    print(f"  best of {len(candidates)} searched {searched[1]}: {searched[0]:9.0f} items/s")
    print(f"  autotuned / best searched: {auto.throughput / searched[0]:.3f} (target >= 0.90)")


def _top_allocations(costs, budget, cores, keep):
    """The ``keep`` allocations with the highest predicted throughput (exhaustive)."""
    names = list(costs)
    scored = []
    for combo in itertools.product(range(1, budget - len(names) + 2), repeat=len(names)):
        if sum(combo) <= budget:
            degrees = dict(zip(names, combo))
            scored.append((predicted_throughput(costs, degrees, cores), -sum(combo), combo))
    scored.sort(reverse=True)
    best = brute_force(costs, budget, cores=cores) if len(names) <= 3 else None
    top = [dict(zip(names, c)) for _, _, c in scored[:keep]]
    return top + ([best] if best and best not in top else [])


def resize_and_rotate(image, rng):
    return random_rotation(resize(image, 32), 15, rng)


def autotune_measured(args, items):
    pipe = (Pipeline.from_iterable(items)
            .map(Decode(), field="image", name="decode")
            .map(resize_and_rotate, field="image", seed=1, name="augment").batch(16))
    cores, threads = args.budget, 2 * args.budget
    maps = ["decode", "augment"]
    costs = measure_costs(pipe, min(len(items), 256))
    model = {n.name: n.num_parallel for n in autotune(pipe, threads, cores=cores,
                                                     costs=costs).nodes if n.name in maps}
    tuned = {n.name: n.num_parallel for n in autotune(pipe, threads, cores=cores, costs=costs,
                                                     refine=2, sample=16).nodes
             if n.name in maps}
    label = lambda degrees: "(" + ", ".join(f"{n} {degrees[n]}" for n in maps) + ")"
    contestants = {f"autotuned {label(tuned)}": with_degrees(pipe, tuned).run}
    for combo in itertools.product(range(1, threads), repeat=len(maps)):
        if sum(combo) <= threads:
            degrees = dict(zip(maps, combo))
            contestants[f"hand {label(degrees)}"] = with_degrees(pipe, degrees).run
    result = timing.compare(contestants, rounds=args.rounds)
    auto = next(iter(contestants))
    best = min((k for k in contestants if k.startswith("hand")), key=lambda k: result[k])
    show(f"autotuner measured here ({cores} CPUs, <= {threads} threads; per-item costs, us: "
         + ", ".join(f"{n} {costs[n] * 1e6:.0f}" for n in maps) + ")", result,
         f"the model alone picks {label(model)}; measured climbing picks {label(tuned)}\n"
         f"{auto} reaches {result[best] / result[auto]:.3f} of the best hand-picked "
         f"{best.removeprefix('hand ')} (target >= 0.90; load {os.getloadavg()[0]:.2f})")


def decode_and_resize(data):
    return resize(decode_png(data), 32)


def ordered(args, items_unused):
    rng = np.random.default_rng(3)
    sizes = rng.choice([24, 48, 96, 160], size=max(args.images // 2, 16), p=[0.4, 0.3, 0.2, 0.1])
    varied = []
    for i, size in enumerate(sizes):
        encoded, labels = synthetic_images(1, size=int(size), seed=i)
        varied.append({"image": encoded[0], "label": int(labels[0])})
    make = lambda par, det: (Pipeline.from_iterable(varied)
                             .map(decode_and_resize, field="image", num_parallel=par,
                                  deterministic=det, name="decode+resize").batch(64))
    result = timing.compare({"ordered (producer i owns i + M*k)": make(2, True).run,
                             "unordered (as ready)": make(2, False).run}, rounds=args.rounds)
    make(None, True).run()  # warm-up
    profile = make(None, True).profile()
    per_item = sorted((e.item, e.end - e.start) for e in profile.timeline
                      if e.stage == "decode+resize")
    costs = [c for _, c in per_item]
    stages = [sim.SimStage("decode+resize", costs, 3), sim.SimStage("to_device", 1e-6, 1)]
    sim_ordered = sim.simulate(stages, len(costs), ordered=True).throughput
    sim_loose = sim.simulate(stages, len(costs), ordered=False).throughput
    show("ordered vs unordered parallel map (2 threads; per-item cost "
         f"{min(costs) * 1e6:.0f}-{max(costs) * 1e6:.0f} us)", result,
         f"unordered vs ordered: measured {result.speedup('unordered (as ready)'):.2f}x; "
         f"simulated with 3 workers and these per-item costs {sim_loose / sim_ordered:.2f}x")


SECTIONS = {"fusion": fusion, "vectorise": vectorise, "autotune-sim": autotune_sim,
            "autotune": autotune_measured, "ordered": ordered}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images and rounds")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--size", type=int, default=64, help="encoded image side (pixels)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=2, help="CPUs for the measured autotuner")
    parser.add_argument("--sim-items", type=int, default=600)
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds, args.sim_items = min(args.images, 192), 3, 300
    print(f"data pipeline benchmark: {args.images} synthetic {args.size}x{args.size} PNGs, "
          f"best of {args.rounds} interleaved rounds, {os.cpu_count()} CPUs "
          "(shared machine: timings are noisy)")
    items = records(args.images, args.size)
    for name in args.sections:
        SECTIONS[name](args, items)


if __name__ == "__main__":
    main()
