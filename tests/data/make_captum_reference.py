"""Regenerate ``tests/data/captum_reference.npz``: Captum's and SHAP's attributions for the
chapter 16 models (``mlsys_lab/explain/models.npz``).

Run from the repository root where torch, captum and shap are installed (CI never needs them;
the tests import this file's constants, so torch is imported inside the functions)::

    python tests/data/make_captum_reference.py

The digits CNN is rebuilt in PyTorch, float64, from the committed weights; for a few digits it
stores Captum's ``Saliency``, ``InputXGradient``, ``IntegratedGradients`` (64 steps, every
method, zero and mean-image baselines), ``LayerGradCam`` (three layers, ``relu_attributions``)
and ``Occlusion`` (two window/stride settings). For the wine MLP it stores SHAP's exact
Shapley values (``ExactExplainer`` with an ``Independent`` masker over the whole background) and
``KernelExplainer``'s values with every coalition (``l1_reg=False``: its default may
select features first, which zeroes some), and ``lime``'s ``LimeTabularExplainer`` (regression
mode, no discretisation, ``random_state=0``, 5000 samples) coefficients, intercept and score.
Inputs, targets and a digest of the weights are stored too, so the tests notice a stale file.
Arrays only, no pickle; compressed.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from mlsys_lab.explain import models  # noqa: E402

OUT = os.path.join(HERE, "captum_reference.npz")
DIGITS = [0, 17, 42, 123]
WINE = [0, 60, 130]
IG_RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
            "gausslegendre")
CAM_LAYERS = (0, 3, 4)
LIME_SEED, LIME_SAMPLES = 0, 5000
OCCLUSION = {"w2s1": ((1, 2, 2), (1, 1, 1)), "w3s2": ((1, 3, 3), (1, 2, 2))}


def weights_digest(m):
    """A fingerprint of the weights (the sum of |w| * position), shared with the tests."""
    return np.array([float(np.sum(np.abs(np.asarray(p.data)).ravel()
                                  * np.arange(1, np.asarray(p.data).size + 1)))
                     for p in m.parameters()])


def torch_digits(m):
    import torch

    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(32, 10)).double()
    sd = {k: np.asarray(v.data) for k, v in m.named_parameters()}
    with torch.no_grad():
        for i in (0, 3):
            net[i].weight.copy_(torch.from_numpy(sd[f"{i}.weight"]))
            net[i].bias.copy_(torch.from_numpy(sd[f"{i}.bias"]))
        net[7].weight.copy_(torch.from_numpy(sd["7.weight"].T.copy()))
        net[7].bias.copy_(torch.from_numpy(sd["7.bias"]))
    return net.eval()


def torch_wine(m):
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(13, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 3)).double()
    sd = {k: np.asarray(v.data) for k, v in m.named_parameters()}
    with torch.no_grad():
        for i in (0, 2):
            net[i].weight.copy_(torch.from_numpy(sd[f"{i}.weight"].T.copy()))
            net[i].bias.copy_(torch.from_numpy(sd[f"{i}.bias"]))
    return net.eval()


def main():
    import shap
    import torch
    from captum.attr import InputXGradient, IntegratedGradients, LayerGradCam, Occlusion, Saliency

    torch.manual_seed(0)
    M = models.load()
    out = {"digits_index": np.array(DIGITS), "wine_index": np.array(WINE),
           "digits_digest": weights_digest(M.digits), "wine_digest": weights_digest(M.wine)}
    net = torch_digits(M.digits)
    x = torch.from_numpy(M.digits_x[DIGITS].copy())
    targets = [int(t) for t in M.digits_y[DIGITS]]
    out["digits_x"], out["digits_target"] = x.numpy().copy(), np.array(targets)
    ours = M.digits(M.digits_x[DIGITS]).numpy()
    assert np.allclose(net(x).detach().numpy(), ours, atol=1e-10), "the two CNNs differ"
    mean_image = torch.from_numpy(M.digits_x.mean(axis=0, keepdims=True))
    out["mean_image"] = mean_image.numpy()[0].copy()
    t = torch.tensor(targets)
    out["saliency"] = Saliency(net).attribute(x, target=t).numpy()
    out["saliency_signed"] = Saliency(net).attribute(x, target=t, abs=False).numpy()
    out["input_x_gradient"] = InputXGradient(net).attribute(x, target=t).detach().numpy()
    for rule in IG_RULES:
        ig = IntegratedGradients(net)
        attr, delta = ig.attribute(x, target=t, n_steps=64, method=rule,
                                   return_convergence_delta=True)
        out[f"ig_{rule}"] = attr.detach().numpy()
        out[f"ig_{rule}_delta"] = delta.detach().numpy()
        out[f"ig_{rule}_mean_baseline"] = ig.attribute(
            x, baselines=mean_image.expand_as(x), target=t, n_steps=64,
            method=rule).detach().numpy()
    for layer in CAM_LAYERS:
        cam = LayerGradCam(net, net[layer]).attribute(x, target=t, relu_attributions=True)
        out[f"grad_cam_{layer}"] = cam.detach().numpy()[:, 0]
        raw = LayerGradCam(net, net[layer]).attribute(x, target=t, relu_attributions=False)
        out[f"grad_cam_{layer}_raw"] = raw.detach().numpy()[:, 0]
    for name, (window, strides) in OCCLUSION.items():
        occ = Occlusion(net).attribute(x, sliding_window_shapes=window, strides=strides,
                                       baselines=0.0, target=t)
        out[f"occlusion_{name}"] = occ.detach().numpy()

    wnet = torch_wine(M.wine)
    background = M.wine_x[::9].copy()
    wx = M.wine_x[WINE].copy()
    wt = [int(c) for c in M.wine_y[WINE]]
    out["wine_x"], out["wine_target"], out["wine_background"] = wx, np.array(wt), background
    exact, kernel = [], []
    for row, c in zip(wx, wt):
        def f(X, c=c):
            with torch.no_grad():
                return wnet(torch.from_numpy(np.asarray(X, np.float64))).numpy()[:, c]
        masker = shap.maskers.Independent(background, max_samples=len(background))
        ex = shap.explainers.Exact(f, masker)(row[None])
        exact.append(ex.values[0])
        ke = shap.KernelExplainer(f, background)
        kernel.append(ke.shap_values(row[None], nsamples=2 ** 13, l1_reg=False, silent=True)[0])
        out.setdefault("wine_base_value", []).append(float(ke.expected_value))
    out["shap_exact"], out["shap_kernel"] = np.array(exact), np.array(kernel)

    from lime.lime_tabular import LimeTabularExplainer
    coefs, intercepts, scores = [], [], []
    for row, c in zip(wx, wt):
        def g(X, c=c):
            with torch.no_grad():
                return wnet(torch.from_numpy(np.asarray(X, np.float64))).numpy()[:, c]
        explainer = LimeTabularExplainer(M.wine_x, mode="regression", discretize_continuous=False,
                                         random_state=LIME_SEED)
        exp = explainer.explain_instance(row, g, num_features=13, num_samples=LIME_SAMPLES)
        coef = np.zeros(13)
        for i, v in exp.local_exp[1]:  # regression mode: [1] holds the fit, [0] its negation
            coef[i] = v
        coefs.append(coef)
        intercepts.append(exp.intercept[1])
        scores.append(exp.score)
    out["lime_coef"], out["lime_intercept"] = np.array(coefs), np.array(intercepts)
    out["lime_score"] = np.array(scores)
    out["wine_base_value"] = np.array(out["wine_base_value"])
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT}: {len(out)} arrays")


if __name__ == "__main__":
    main()
