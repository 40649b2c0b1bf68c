"""DataLoader throughput on a CPU-bound decode + augment workload (book chapter 9).

    python benchmarks/data_loader.py [--quick] [--samples 3072] [--batch-size 32] [--rounds 3]

The dataset holds N synthetic RGB images (seeded noise on colour gradients) encoded as PNG bytes
in memory; ``__getitem__`` decodes one with Pillow, rotates it by a random angle, resizes it,
normalises it with the book's mean (100, 115, 121) and std (71, 68, 70) and returns it as
float32 CHW with a label. Each contestant is one epoch through a loader whose workers persist
between epochs (so worker start-up is not what is measured); the consumer touches every byte of
each batch. Contestants run interleaved (``timing.compare``), best of ``--rounds`` epochs after
a warm-up epoch, and every worker runs one BLAS thread.

Prints samples/s with 0, 1 and 2 workers and the ratio against 0 workers (target on a 2-core
machine: 2 workers >= 1.8x), and, when torch is installed, the same dataset, batch size and
workers through ``torch.utils.data.DataLoader`` with the ratio ours / torch (target >= 1.0).
On a machine shared with other work the absolute numbers are noisy; the ratios, measured in the
same interleaved run, are the result.

Sections are functions of ``(args, workload)``, so further sections (the pipeline's fused vs
unfused map, vectorised map, autotuning) can be added to ``SECTIONS``.
"""

import argparse
import io
import multiprocessing
import os
import time

import numpy as np
from PIL import Image

from mlsys_lab import timing
from mlsys_lab.data import DataLoader, Dataset

MEAN = np.array([100, 115, 121], np.float32)
STD = np.array([71, 68, 70], np.float32)


def make_png_images(count, size, seed=0):
    """``count`` PNG-encoded ``size`` x ``size`` RGB images: gradients plus seeded noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    images = []
    for _ in range(count):
        r, g, b = rng.uniform(0.2, 1.0, 3)
        base = np.stack([r * ramp[None, :] + 0 * ramp[:, None],
                         g * ramp[:, None] + 0 * ramp[None, :],
                         b * (ramp[None, :] + ramp[:, None]) / 2], axis=-1)
        pixels = np.clip(base + rng.normal(0, 24, (size, size, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
        images.append(buffer.getvalue())
    return images


class PngAugmentDataset(Dataset):
    """Decode + random rotation + resize + normalise + HWC->CHW, per sample (Pillow, numpy).

    The rotation angle comes from numpy's global generator, which each loader worker seeds.
    """

    def __init__(self, images, out_size):
        self.images, self.out_size = images, out_size

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image = Image.open(io.BytesIO(self.images[index])).convert("RGB")
        image = image.rotate(float(np.random.uniform(-15, 15)), resample=Image.BILINEAR)
        image = image.resize((self.out_size, self.out_size), resample=Image.BILINEAR)
        pixels = (np.asarray(image, np.float32) - MEAN) / STD
        return np.ascontiguousarray(pixels.transpose(2, 0, 1)), index % 10


def one_blas_thread(worker_id):
    """worker_init_fn for torch's workers (ours do this by default)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1)


def epoch(loader, to_numpy=np.asarray, usage=None):
    """A callable that runs one epoch of ``loader``, touching every byte of every batch.

    With ``usage`` (a list), each call appends ``(wall s, CPU s of this process, CPU s of its
    child processes)``: where the time went.
    """
    def run():
        start, main, children = time.perf_counter(), time.process_time(), _children_cpu()
        total = 0.0
        for images, _labels in loader:
            total += float(to_numpy(images).sum())
        if usage is not None:
            usage.append((time.perf_counter() - start, time.process_time() - main,
                          _children_cpu() - children))
        return total
    return run


def _children_cpu():
    """CPU seconds used so far by this process's live children (Linux /proc; 0 elsewhere)."""
    total = 0.0
    for child in multiprocessing.active_children():
        try:
            with open(f"/proc/{child.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def ours(workload, workers):
    extra = {"persistent_workers": True} if workers else {}
    return DataLoader(workload["dataset"], batch_size=workload["batch_size"],
                      num_workers=workers, seed=0, **extra)


def torch_loader(workload, workers):
    import torch.utils.data as torch_data
    extra = {"persistent_workers": True, "worker_init_fn": one_blas_thread} if workers else {}
    return torch_data.DataLoader(workload["dataset"], batch_size=workload["batch_size"],
                                 num_workers=workers, **extra)


def workers_section(args, workload):
    """Ours with 0, 1, 2 workers, and torch's loader with the same settings when installed."""
    usage = {w: [] for w in (0, 1, 2)}
    fns = {f"ours, {w} workers": epoch(ours(workload, w), usage=usage[w]) for w in (0, 1, 2)}
    have_torch = _torch_available()
    if have_torch:
        import torch
        torch.set_num_threads(1)  # the consumer's sum, like numpy's, on one thread
        for w in (0, 1, 2):
            fns[f"torch, {w} workers"] = epoch(torch_loader(workload, w), lambda t: t.numpy())
    result = timing.compare(fns, rounds=args.rounds, warmup=1, baseline="ours, 0 workers")
    n = workload["samples"]
    print(f"\n## DataLoader throughput: {n} PNG images {args.size}x{args.size} -> "
          f"{args.out_size}x{args.out_size}, batch {workload['batch_size']}, best of "
          f"{args.rounds} interleaved epochs")
    print(f"{'loader':<20}{'epoch s':>10}{'samples/s':>12}{'vs ours 0w':>12}"
          f"{'ours/torch':>12}")
    for label in fns:
        vs_torch = ""
        if have_torch and label.startswith("ours"):
            twin = label.replace("ours", "torch")
            vs_torch = f"{result[twin] / result[label]:.2f}x"
        print(f"{label:<20}{result[label]:>10.3f}{n / result[label]:>12.0f}"
              f"{result.speedup(label):>11.2f}x{vs_torch:>12}")
    if not have_torch:
        print("(torch is not installed: no torch.utils.data.DataLoader comparison)")
    print("targets: ours 2 workers >= 1.8x ours 0 workers; ours/torch >= 1.0")
    print("where the time went (ours, the fastest epoch of each): CPU seconds of the main "
          "process and of the workers, and the cores they kept busy")
    for w, runs in usage.items():
        wall, main, workers = min(runs[1:] or runs)  # the first call is the warm-up
        print(f"  {w} workers: wall {wall:.3f} s, main {main:.3f} s CPU "
              f"({main / n * 1e6:.0f} us/sample), workers {workers:.3f} s CPU, "
              f"{(main + workers) / wall:.2f} cores busy")
    print(f"  load average now {os.getloadavg()[0]:.2f}: with 2 cores shared, 2 workers can get "
          "at most the cores the other load leaves")


def _torch_available():
    try:
        import torch.utils.data  # noqa: F401
    except ImportError:
        return False
    return True


SECTIONS = [workers_section]


def build_workload(args):
    images = make_png_images(args.samples, args.size)
    return {"dataset": PngAugmentDataset(images, args.out_size), "samples": args.samples,
            "batch_size": args.batch_size}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (fewer samples)")
    parser.add_argument("--samples", type=int, default=3072)
    parser.add_argument("--size", type=int, default=96, help="encoded image side")
    parser.add_argument("--out-size", type=int, default=64, help="side after resizing")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-pipeline", action="store_true",
                        help="skip the Pipeline sections (benchmarks/data_pipeline.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.rounds = min(args.samples, 384), min(args.rounds, 2)
    print(f"cores: {os.cpu_count()}, load average: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: noisy)")
    workload = build_workload(args)
    for section in SECTIONS:
        section(args, workload)
    if not args.no_pipeline:  # fusion, vectorisation, autotuning, ordered map: the script beside
        import data_pipeline

        data_pipeline.main(["--quick"] if args.quick else [])


if __name__ == "__main__":
    main()
