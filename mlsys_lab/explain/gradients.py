"""Gradient attributions: saliency, gradient x input, SmoothGrad and Integrated Gradients.

Each differentiates the target output with respect to the input through ``ml.grad`` (one
batched backward pass per call). Integrated Gradients integrates the gradient along the straight
path from a baseline x' to x; :func:`path_rule` gives the points and weights of the quadrature
(the Riemann rules and Gauss-Legendre, as Captum names them), and the result carries the
completeness error |sum(attributions) - (f(x) - f(x'))| that the axiom says is zero.
"""

import numpy as np

from ..errors import ArgumentError
from .core import CountedModel, Explanation, check_baseline, check_count, check_input

#: The quadrature rules of :func:`path_rule`.
RULES = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def path_rule(steps: int, rule: str = "gausslegendre"):
    """Points ``alphas`` in [0, 1] and weights of a ``steps``-point rule for the integral over
    [0, 1] (the weights sum to 1).

    ``riemann_left``/``right``/``middle`` use the left ends, right ends or midpoints of ``steps``
    equal pieces; ``riemann_trapezoid`` uses ``steps`` equally spaced points including both ends
    with the ends weighted by half; ``gausslegendre`` uses the Legendre nodes.
    """
    steps = check_count("path_rule", "steps", steps, 2 if rule == "riemann_trapezoid" else 1)
    n = steps
    if rule == "riemann_left":
        return np.linspace(0.0, 1.0 - 1.0 / n, n), np.full(n, 1.0 / n)
    if rule == "riemann_right":
        return np.linspace(1.0 / n, 1.0, n), np.full(n, 1.0 / n)
    if rule == "riemann_middle":
        return np.linspace(0.5 / n, 1.0 - 0.5 / n, n), np.full(n, 1.0 / n)
    if rule == "riemann_trapezoid":
        w = np.full(n, 1.0 / (n - 1))
        w[0] = w[-1] = 0.5 / (n - 1)
        return np.linspace(0.0, 1.0, n), w
    if rule == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n)
        return (nodes + 1.0) / 2.0, weights / 2.0
    raise ArgumentError(f"path_rule: rule must be one of {RULES}, got {rule!r}")


def saliency(model, x, target=None, absolute: bool = True) -> Explanation:
    """The gradient of the target output at ``x`` (its absolute value by default, as Captum's
    ``Saliency``). Cost: 1 forward, 1 backward."""
    x = check_input("saliency", x)
    m = CountedModel(model, target, "saliency")
    _, g = m.gradients(x[None])
    return m.explanation(np.abs(g[0]) if absolute else g[0], "saliency")


def gradient_x_input(model, x, target=None) -> Explanation:
    """The gradient at ``x`` times ``x`` (Captum's ``InputXGradient``). Cost: 1 + 1."""
    x = check_input("gradient_x_input", x)
    m = CountedModel(model, target, "gradient_x_input")
    _, g = m.gradients(x[None])
    return m.explanation(g[0] * x, "gradient_x_input")


def smoothgrad(model, x, target=None, samples: int = 32, noise: float = 0.15,
               absolute: bool = False, seed: int = 0) -> Explanation:
    """The gradient averaged over ``samples`` copies of ``x`` with Gaussian noise of standard
    deviation ``noise * (x.max() - x.min())`` (Smilkov et al. 2017). Cost: samples + samples."""
    x = check_input("smoothgrad", x)
    samples = check_count("smoothgrad", "samples", samples)
    m = CountedModel(model, target, "smoothgrad")
    sigma = noise * float(x.max() - x.min())
    noisy = x[None] + np.random.default_rng(seed).normal(0.0, sigma, (samples,) + x.shape)
    _, g = m.gradients(noisy.astype(x.dtype))
    g = np.abs(g) if absolute else g
    return m.explanation(g.mean(axis=0), "smoothgrad", noise_std=sigma)


def integrated_gradients(model, x, target=None, baseline=None, steps: int = 64,
                         rule: str = "gausslegendre") -> Explanation:
    """Integrated Gradients (Sundararajan et al. 2017):
    ``(x - x') * integral_0^1 grad f(x' + a (x - x')) da`` by a ``steps``-point rule.

    Args:
        model: the model; target: the output explained.
        x: one input (no batch axis); baseline: x' (zeros by default; a number or an array
            broadcast to x).
        steps: quadrature points (gradient evaluations).
        rule: one of :data:`RULES` (Captum's names; Captum's default is ``gausslegendre``).

    Returns:
        An :class:`Explanation` whose ``info`` holds ``delta`` = f(x) - f(x'),
        ``completeness_error`` = |sum(attributions) - delta| and ``relative_error`` = that over
        |delta|. Cost: steps + 2 forward (the path and both ends), steps backward.
    """
    x = check_input("integrated_gradients", x)
    base = check_baseline("integrated_gradients", x, baseline)
    alphas, weights = path_rule(steps, rule)
    m = CountedModel(model, target, "integrated_gradients")
    diff = x - base
    path = base[None] + alphas.reshape((-1,) + (1,) * x.ndim) * diff[None]
    _, g = m.gradients(path.astype(x.dtype))
    avg = np.tensordot(weights, g, axes=1)
    attributions = diff * avg
    ends = m.values(np.stack([x, base]))
    delta = float(ends[0] - ends[1])
    error = abs(float(attributions.sum()) - delta)
    return m.explanation(attributions, "integrated_gradients", delta=delta,
                         completeness_error=error,
                         relative_error=error / abs(delta) if delta else float("inf"),
                         steps=len(alphas), rule=rule)


def integrated_gradients_to_tolerance(model, x, target=None, baseline=None,
                                      tolerance: float = 1e-3, steps: int = 16,
                                      max_steps: int = 4096,
                                      rule: str = "riemann_middle") -> Explanation:
    """Integrated Gradients with the steps doubled until the relative completeness error is
    below ``tolerance`` (or ``max_steps`` is reached).

    On a ReLU network the path gradient jumps, every rule converges only like 1/steps, and no
    fixed count suits every input; completeness is the check that tells when to stop.

    Returns:
        The last round's :class:`Explanation`, with ``forward``/``backward`` summed over every
        round and ``info['rounds']``; ``info['converged']`` says whether the tolerance was met.
    """
    if not tolerance > 0:
        raise ArgumentError(f"integrated_gradients_to_tolerance: tolerance must be > 0, "
                            f"got {tolerance!r}")
    steps = check_count("integrated_gradients_to_tolerance", "steps", steps, 2)
    forward = backward = rounds = 0
    while True:
        out = integrated_gradients(model, x, target, baseline, steps, rule)
        forward, backward, rounds = forward + out.forward, backward + out.backward, rounds + 1
        if out.info["relative_error"] < tolerance or 2 * steps > max_steps:
            break
        steps *= 2
    out.forward, out.backward = forward, backward
    out.info.update(rounds=rounds, converged=bool(out.info["relative_error"] < tolerance))
    return out
