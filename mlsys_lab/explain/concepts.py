"""TCAV (Kim et al. 2018): testing a model with concept activation vectors.

A concept is a set of examples. Their activations at a layer, against those of random examples,
train a linear classifier (logistic regression here); its unit normal is the concept activation
vector (CAV) v. For an input x of class k, S(x) = grad_h f_k(h(x)) . v is the directional
derivative of the class logit along the concept; the TCAV score is the fraction of the class's
inputs with S(x) > 0. A score means something only if it differs from chance: the CAV is trained
against several random sets, and the scores are compared by a two-sided t-test with those of
CAVs trained between random sets (random concepts). The p-value uses Student's t distribution,
computed here from the regularised incomplete beta function.
"""

from dataclasses import dataclass, field
from math import lgamma, log

import numpy as np

from ..engine.tensor import no_grad
from ..errors import ArgumentError, ShapeError
from .cam import split_at
from .core import CountedModel


def logistic_regression(X, y, l2: float = 1e-2, iterations: int = 50):
    """(w, b) of an L2-regularised logistic regression by Newton's method (labels 0/1).

    Minimises sum_i log(1 + exp(-s_i (x_i . w + b))) + (l2 n / 2) |w|^2 (s_i = +-1; b is not
    penalised). With more features than rows (a layer's activations) the Newton steps run on
    w = X^T alpha, an (n + 1)-dimensional problem with the same optimum (the representer
    theorem), instead of a (d + 1)-dimensional one.
    """
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    n, d = X.shape
    lam = l2 * n
    dual = d > n
    F = X @ X.T if dual else X              # f = F theta[:-1] + b in both forms
    m = F.shape[1]
    theta = np.zeros(m + 1)
    for _ in range(iterations):
        f = F @ theta[:-1] + theta[-1]
        p = 1.0 / (1.0 + np.exp(-np.clip(f, -500, 500)))
        r, s = p - y, p * (1 - p)
        H = np.empty((m + 1, m + 1))
        if dual:
            # the Newton system K(S K + lam I) da + K S 1 db = K (r + lam a), with K cancelled
            # (a solution of the reduced system solves the full one, singular K or not)
            H[:m, :m] = s[:, None] * F + lam * np.eye(m)
            H[:m, m] = s
            H[m, :m] = s @ F
            g = np.r_[r + lam * theta[:-1], r.sum()]
        else:
            H[:m, :m] = (F.T * s) @ F + lam * np.eye(m)
            H[:m, m] = H[m, :m] = F.T @ s
            g = np.r_[F.T @ r + lam * theta[:-1], r.sum()]
        H[m, m] = s.sum()
        step = np.linalg.solve(H, g)
        theta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    w = X.T @ theta[:-1] if dual else theta[:-1]
    return w, float(theta[-1])


def activations(model, layer, inputs):
    """The layer's outputs for a batch of inputs, flattened to (n, features)."""
    head, _ = split_at(model, layer, "tcav")
    with no_grad():
        a = head(np.asarray(inputs))
    return np.asarray(a.numpy()).reshape(len(inputs), -1)


def concept_activation_vector(concept_acts, random_acts, l2: float = 1e-2):
    """The unit CAV pointing from the random activations towards the concept's."""
    c, r = np.asarray(concept_acts), np.asarray(random_acts)
    if c.ndim != 2 or r.ndim != 2 or c.shape[1] != r.shape[1]:
        raise ShapeError(f"concept_activation_vector: activations must be (n, d) with equal d, "
                         f"got {c.shape} and {r.shape}")
    w, _ = logistic_regression(np.vstack([c, r]), np.r_[np.ones(len(c)), np.zeros(len(r))], l2)
    norm = np.linalg.norm(w)
    if norm == 0:
        raise ArgumentError("concept_activation_vector: the concept and random activations "
                            "cannot be told apart (zero CAV)")
    return w / norm


def directional_derivatives(model, layer, inputs, target, cav):
    """S(x) = grad_h f_target . cav for each input, and the counted model (for its cost)."""
    head, tail = split_at(model, layer, "tcav")
    with no_grad():
        a = np.asarray(head(np.asarray(inputs)).numpy())
    m = CountedModel(tail, target, "tcav")
    _, g = m.gradients(a)
    return g.reshape(len(inputs), -1) @ cav, m


def tcav_score(model, layer, inputs, target, cav) -> float:
    """The fraction of ``inputs`` whose target logit grows along ``cav``."""
    s, _ = directional_derivatives(model, layer, inputs, target, cav)
    return float(np.mean(s > 0))


def _betacf(a, b, x, iterations=300, eps=1e-15):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, iterations + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if not 0.0 <= x <= 1.0:
        raise ArgumentError(f"betainc: x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = np.exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log(1.0 - x))
    if x < (a + 1.0) / (a + b + 2.0):
        return float(front * _betacf(a, b, x) / a)
    return float(1.0 - front * _betacf(b, a, 1.0 - x) / b)


def t_test(a, b):
    """Student's two-sample t-test with pooled variance (scipy's ``ttest_ind``): (t, p)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) < 2 or len(b) < 2:
        raise ArgumentError(f"t_test: needs two samples of at least 2, got {len(a)}, {len(b)}")
    df = len(a) + len(b) - 2
    pooled = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / df
    diff = a.mean() - b.mean()
    se = np.sqrt(pooled * (1.0 / len(a) + 1.0 / len(b)))
    if se == 0:
        return (0.0, 1.0) if diff == 0 else (float(np.sign(diff) * np.inf), 0.0)
    t = float(diff / se)
    return t, betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass
class TCAVResult:
    """Scores of the concept's CAVs and of random CAVs, the test, and the cost.

    ``significant`` is ``p < alpha``; ``forward``/``backward`` count the model's rows
    (activations of concept and random sets, and one gradient per input per CAV).
    """

    scores: np.ndarray
    random_scores: np.ndarray
    t: float
    p: float
    significant: bool
    forward: int
    backward: int
    info: dict = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The mean TCAV score over the concept's CAVs."""
        return float(np.mean(self.scores))


def tcav(model, layer, inputs, target, concept, randoms, alpha: float = 0.05,
         l2: float = 1e-2) -> TCAVResult:
    """TCAV of ``concept`` for class ``target`` at ``layer``, tested against random concepts.

    Args:
        model: a ``Sequential`` model; layer: index or object of the layer.
        inputs: (n, ...) inputs of the class; concept: (c, ...) concept examples.
        randoms: a list of at least 3 random example sets. The concept is trained against each
            set but the first; the first set, as a random concept, against each of the others.
        alpha: the test's level.
    """
    if len(randoms) < 3:
        raise ArgumentError(f"tcav: needs at least 3 random sets, got {len(randoms)}")
    concept_acts = activations(model, layer, concept)
    random_acts = [activations(model, layer, r) for r in randoms]
    forward = len(concept) + sum(len(r) for r in randoms)
    backward = 0
    scores, random_scores = [], []
    for ra in random_acts[1:]:
        for acts, out in ((concept_acts, scores), (random_acts[0], random_scores)):
            s, m = directional_derivatives(model, layer, inputs, target,
                                           concept_activation_vector(acts, ra, l2))
            out.append(float(np.mean(s > 0)))
            forward += m.forward  # head and tail together: one model pass per input
            backward += m.backward
    t, p = t_test(scores, random_scores)
    return TCAVResult(np.array(scores), np.array(random_scores), t, p, bool(p < alpha),
                      forward, backward)
