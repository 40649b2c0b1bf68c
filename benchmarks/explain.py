"""Explainable AI (book chapter 16): model evaluations and wall time per explanation of one
digit, for every method of ``mlsys_lab.explain`` on the chapter's digits CNN, against Captum on
the same model in PyTorch when torch and captum are installed.

    python benchmarks/explain.py [--repeats 7] [--threads 1]

The digits CNN (``mlsys_lab.explain.models``: conv 16 - pool - conv 32 - global average pool -
linear, float64) explains the predicted class of digit 17. Each row: the forward and backward
passes the method reports (inputs through the model), and its best-of-``repeats`` wall time,
the methods interleaved in each repeat. Captum's rows use the same method and step count
(Integrated Gradients: 64 Gauss-Legendre points in one batch; ``LayerGradCam`` at layer 4;
``Occlusion`` with a 1x2x2 window, stride 1, one perturbation per call as in its default, and
with 64 per call; ours always sends 64 windows per call, so its two occlusion rows are the same
call), PyTorch float64 with ``--threads`` threads, like BLAS here. Ratio = ours /
Captum's time (below 1: faster). Targets: <= 1.5 for IG and Grad-CAM.

Also the tabular model (wine MLP): exact Shapley values (2^13 coalitions x 20 background rows)
and KernelSHAP with all coalitions and with 400 sampled, and LIME with 2000 samples.
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mlsys_lab.explain import (  # noqa: E402
    cam,
    gradients,
    lime,
    models,
    perturbation,
    shapley,
)


def best_of(fns, repeats):
    """{name: (best seconds, last result)} with the functions interleaved in each repeat."""
    best = {k: np.inf for k in fns}
    last = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            last[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {k: (best[k], last[k]) for k in fns}


def captum_rows(M, x, t, threads):
    """Captum's methods on the same float64 model, or None without torch/captum."""
    try:
        import torch
        from captum.attr import IntegratedGradients, LayerGradCam, Occlusion, Saliency
    except ImportError:
        return None
    from tests.data.make_captum_reference import torch_digits

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", message="Input Tensor 0 did not already require")
    net = torch_digits(M.digits)
    xt = torch.from_numpy(x[None].copy())
    return {
        "saliency": lambda: Saliency(net).attribute(xt, target=t),
        "integrated gradients (64)": lambda: IntegratedGradients(net).attribute(
            xt, target=t, n_steps=64, method="gausslegendre"),
        "grad-cam (layer 4)": lambda: LayerGradCam(net, net[4]).attribute(
            xt, target=t, relu_attributions=True),
        "occlusion 2x2": lambda: Occlusion(net).attribute(
            xt, sliding_window_shapes=(1, 2, 2), strides=1, baselines=0.0, target=t),
        "occlusion 2x2 (64 per call)": lambda: Occlusion(net).attribute(
            xt, sliding_window_shapes=(1, 2, 2), strides=1, baselines=0.0, target=t,
            perturbations_per_eval=64),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    threadpool_limits(args.threads)
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    M = models.load()
    x = M.digits_x[17]
    t = int(np.argmax(M.digits(x[None]).numpy()))
    ours = {
        "saliency": lambda: gradients.saliency(M.digits, x, t),
        "gradient x input": lambda: gradients.gradient_x_input(M.digits, x, t),
        "smoothgrad (32)": lambda: gradients.smoothgrad(M.digits, x, t, samples=32),
        "integrated gradients (64)": lambda: gradients.integrated_gradients(M.digits, x, t,
                                                                            steps=64),
        "grad-cam (layer 4)": lambda: cam.grad_cam(M.digits, x, t, 4),
        "occlusion 2x2": lambda: perturbation.occlusion(M.digits, x, t),
        "occlusion 2x2 (64 per call)": lambda: perturbation.occlusion(M.digits, x, t),
        "rise (1000 masks)": lambda: perturbation.rise(M.digits, x, t, masks=1000),
    }
    for fn in ours.values():  # compile the kernels before timing
        fn()
    theirs = captum_rows(M, x, t, args.threads)
    fns = dict(ours)
    if theirs:
        for fn in theirs.values():
            fn()
        fns.update({("captum", k): v for k, v in theirs.items()})
    timed = best_of(fns, args.repeats)
    print(f"\ndigits CNN, one explanation of digit 17 (class {t}), best of {args.repeats}:")
    head = f"{'method':30s} {'forward':>8s} {'backward':>9s} {'ours ms':>9s}"
    print(head + (f" {'captum ms':>10s} {'ratio':>6s}" if theirs else "  (captum not installed)"))
    for name in ours:
        sec, e = timed[name]
        row = f"{name:30s} {e.forward:8d} {e.backward:9d} {sec * 1e3:9.2f}"
        if theirs and name in theirs:
            other = timed[("captum", name)][0]
            row += f" {other * 1e3:10.2f} {sec / other:6.2f}"
        print(row)
    if theirs:
        for name in ("integrated gradients (64)", "grad-cam (layer 4)"):
            ratio = timed[name][0] / timed[("captum", name)][0]
            print(f"target {name}: ours / captum = {ratio:.2f} <= 1.5: "
                  f"{'met' if ratio <= 1.5 else 'NOT met'}")

    xw, bg = M.wine_x[60], M.wine_x[::9]
    tw = int(M.wine_y[60])
    tab = {
        "exact shapley (8192 coalitions)": lambda: shapley.exact_shapley(M.wine, xw, bg, tw),
        "kernelshap (all coalitions)": lambda: shapley.kernel_shap(M.wine, xw, bg, tw),
        "kernelshap (400 sampled)": lambda: shapley.kernel_shap(M.wine, xw, bg, tw,
                                                                samples=400),
        "lime (2000 samples)": lambda: lime.lime_tabular(M.wine, xw, M.wine_x, tw,
                                                         samples=2000),
    }
    timed = best_of(tab, max(1, args.repeats // 2))
    print(f"\nwine MLP, 13 features, 20 background rows, best of {max(1, args.repeats // 2)}:")
    print(f"{'method':34s} {'forward':>9s} {'ms':>9s}")
    for name, (sec, e) in timed.items():
        print(f"{name:34s} {e.forward:9d} {sec * 1e3:9.2f}")


if __name__ == "__main__":
    main()
