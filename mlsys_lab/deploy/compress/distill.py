"""Knowledge distillation (book ch. 10): a small student learns from a large teacher's soft outputs.

    L = H(o_S, y) + λ · H(τ(o_S), τ(o_T)),     τ(o) = softmax(o / T)

``H(p, q) = -Σ q log p`` is the cross-entropy of the prediction ``p`` against the target ``q``:
the first term is the usual loss on the labels ``y``, the second pulls the student's softened
distribution towards the teacher's. A temperature ``T > 1`` flattens both, so the teacher's
ranking of the wrong classes ("a 3 looks more like an 8 than a 1") carries signal. Hinton et al.
multiply the soft term by ``T²`` to keep its gradient's size independent of ``T``
(``tau_squared=True``).
"""

from __future__ import annotations

import numpy as np

from ... import ops
from ...engine.tensor import Tensor, as_tensor
from ...errors import ArgumentError, ShapeError


def soft_targets(logits, temperature):
    """``τ(o) = softmax(o / T)`` over the last axis."""
    return ops.softmax(as_tensor(logits) / float(temperature), axis=-1)


def soft_cross_entropy(student_logits, target_probs, temperature=1.0):
    """``H(τ(o_S), q) = -mean_batch Σ_c q_c log softmax(o_S / T)_c`` for target distributions
    ``q`` (constants: no gradient flows into them)."""
    log_p = ops.log_softmax(as_tensor(student_logits) / float(temperature), axis=-1)
    q = Tensor(np.asarray(target_probs.numpy() if isinstance(target_probs, Tensor)
                          else target_probs, dtype=log_p.dtype))
    return -ops.mean(ops.sum(q * log_p, axis=-1))


def distillation_loss(student_logits, labels, teacher_logits, temperature=4.0, lam=0.5,
                      tau_squared=False):
    """``H(o_S, y) + λ · H(τ(o_S), τ(o_T))`` averaged over the batch.

    Args:
        student_logits: (B, C) Tensor (differentiable).
        labels: (B,) integer class labels.
        teacher_logits: (B, C) array or Tensor; treated as a constant.
        temperature: ``T`` of ``τ``.
        lam: ``λ``, the weight of the soft term.
        tau_squared: multiply the soft term by ``T²`` (Hinton et al.).

    Returns:
        The scalar loss Tensor.
    """
    s = as_tensor(student_logits)
    t = teacher_logits.numpy() if isinstance(teacher_logits, Tensor) else \
        np.asarray(teacher_logits)
    if s.ndim != 2 or tuple(t.shape) != tuple(s.shape):
        raise ShapeError(f"distillation_loss: student logits {tuple(s.shape)} and teacher "
                         f"logits {tuple(t.shape)} must be one (batch, classes) shape")
    if not temperature > 0 or not lam >= 0:
        raise ArgumentError(f"distillation_loss: needs temperature > 0 and lam >= 0, got "
                            f"{temperature!r}, {lam!r}")
    hard = ops.cross_entropy(s, as_tensor(labels))
    teacher = soft_targets(Tensor(t.astype(s.dtype)), temperature).numpy()
    soft = soft_cross_entropy(s, teacher, temperature)
    weight = lam * (temperature ** 2 if tau_squared else 1.0)
    return hard + weight * soft


def _batches(x, y, batch, rng):
    order = rng.permutation(len(x))
    for i in range(0, len(x), batch):
        take = order[i:i + batch]
        yield x[take], y[take]


def train(model, optimizer, x, y, epochs=10, batch=64, teacher=None, temperature=4.0, lam=0.5,
          tau_squared=False, seed=0):
    """Train ``model`` on ``(x, y)``: plain cross-entropy, or with a ``teacher`` (a callable
    giving logits) the distillation loss. Returns the mean loss of each epoch."""
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(epochs):
        total, steps = 0.0, 0
        for xb, yb in _batches(np.asarray(x), np.asarray(y), batch, rng):
            out = model(Tensor(xb))
            if teacher is None:
                loss = ops.cross_entropy(out, Tensor(yb))
            else:
                t = np.asarray(teacher(Tensor(xb)).numpy())
                loss = distillation_loss(out, yb, t, temperature, lam, tau_squared)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + float(loss.numpy()), steps + 1
        history.append(total / max(steps, 1))
    return history


def accuracy(model, x, y):
    """The fraction of ``x`` that ``model`` classifies as ``y``."""
    logits = np.asarray(model(Tensor(np.asarray(x))).numpy())
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(y)))


__all__ = ["soft_targets", "soft_cross_entropy", "distillation_loss", "train", "accuracy"]
