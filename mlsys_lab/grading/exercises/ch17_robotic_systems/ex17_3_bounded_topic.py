"""Exercise 17.3: a topic's bounded queue with ROS 2's KEEP_LAST history.

The student writes a class ``KeepLast(depth)`` with ``push(msg)`` (a message arrives; returns
the message it dropped, or ``None``), ``pop()`` (the callback takes the oldest message kept;
``None`` when empty) and ``len()``. With ``depth`` k the queue keeps the k *newest* messages: a
message that arrives to a full queue pushes out the *oldest*. ``depth < 1`` raises
``ValueError``.

The judge's reference is a plain list model written here (append, and delete the head when the
list is longer than k). The last case runs the answer as a subscriber's queue: a 100 Hz
publisher, a callback of 35 ms, and the callback must see the newest messages.

Wrong ideas rejected: dropping the newest (refusing the arriving message when full: the
subscriber then works on stale data); an unbounded queue (never drops: the subscriber falls
further and further behind); depth off by one (keeps k + 1, or k − 1); popping the newest
(LIFO: messages out of order); every instance sharing one class-level list (two topics mix).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    Raised,
    attempt,
    describe,
    expect_each_raised,
    register,
)

# ----------------------------------------------------------------------------- the reference


def _model(ops, depth):
    """What a KEEP_LAST queue of ``depth`` gives for ``ops`` (``("push", x)`` / ``("pop",)``):
    the value each op returns and the length after it."""
    q, out = [], []
    for op in ops:
        if op[0] == "push":
            q.append(op[1])
            dropped = q.pop(0) if len(q) > depth else None
            out.append([dropped, len(q)])
        else:
            out.append([q.pop(0) if q else None, len(q)])
    return out


def _ops(seed: int, kind: str):
    rng = np.random.default_rng(17300 + seed * 7 + len(kind))
    if kind == "burst":
        depth = int(rng.integers(2, 6))
        n = depth + int(rng.integers(3, 9))
        ops = [("push", 100 + i) for i in range(n)] + [("pop",)] * (depth + 2)
    elif kind == "depth one":
        depth = 1
        ops = [("push", i) for i in range(5)] + [("pop",), ("pop",), ("push", 9), ("pop",)]
    else:
        depth = int(rng.integers(1, 5))
        ops, k = [], 0
        for _ in range(60):
            if rng.random() < 0.6:
                ops.append(("push", k))
                k += 1
            else:
                ops.append(("pop",))
    return depth, ops


def _apply(cls, depth, ops):
    q = cls(depth)
    out = []
    for op in ops:
        got = q.push(op[1]) if op[0] == "push" else q.pop()
        out.append([got, len(q)])
    return out


# ----------------------------------------------------------------------------- probes, judges


def _probe(kind):
    def probe(KeepLast, seed):
        depth, ops = _ops(seed, kind)
        return attempt(_apply, KeepLast, depth, ops)
    return probe


def _judge(kind, what):
    def judge(raw, seed):
        depth, ops = _ops(seed, kind)
        want = _model(ops, depth)
        if isinstance(raw, Raised):
            raise AssertionError(f"{what}: {raw}")
        if not isinstance(raw, list) or len(raw) != len(want):
            raise AssertionError(f"{what}: expected {len(want)} results, got {describe(raw)}")
        for i, (got, exp) in enumerate(zip(raw, want)):
            if got != exp:
                op = ops[i]
                shown = f"push({op[1]})" if op[0] == "push" else "pop()"
                raise AssertionError(
                    f"{what} (depth {depth}): op {i + 1}, {shown}, gave {got[0]!r} with "
                    f"len {got[1]!r}; KEEP_LAST gives {exp[0]!r} with len {exp[1]!r}")
    return judge


def _two_queues_probe(KeepLast):
    def run():
        a, b = KeepLast(2), KeepLast(3)
        for i in range(4):
            a.push(f"a{i}")
            b.push(f"b{i}")
        return [[a.pop(), a.pop(), a.pop()], [b.pop(), b.pop(), b.pop(), b.pop()]]
    return attempt(run)


def _two_queues_judge(raw):
    want = [["a2", "a3", None], ["b1", "b2", "b3", None]]
    if raw != want:
        raise AssertionError(f"two queues (depths 2 and 3) fed side by side gave "
                             f"{describe(raw)}, expected {want}: each queue has its own state")


def _subscriber(push, pop):
    """A publisher every 10 ms, a subscriber whose callback takes 35 ms (integer ms): which
    messages the callback gets, through ``push`` and ``pop``."""
    seen, free_at = [], 0
    for i in range(40):
        at = 10 * i
        while free_at <= at:  # callbacks that start before this arrival
            msg = pop()
            if msg is None:
                break
            seen.append(msg)
            free_at += 35
        push(i)
        free_at = max(free_at, at)  # an idle subscriber starts when the message arrives
    while (msg := pop()) is not None:
        seen.append(msg)
    return seen


def _subscriber_probe(KeepLast):
    def run():
        q = KeepLast(2)
        return _subscriber(q.push, q.pop)
    return attempt(run)


def _subscriber_reference():
    q = []

    def push(x):
        q.append(x)
        if len(q) > 2:
            q.pop(0)
    return _subscriber(push, lambda: q.pop(0) if q else None)


def _subscriber_judge(raw):
    want = _subscriber_reference()
    if raw != want:
        raise AssertionError(f"a 35 ms callback on a 100 Hz topic (depth 2) processed "
                             f"{describe(raw)}, KEEP_LAST processes {want}")


_BAD_DEPTHS = [(0,), (-3,)]


def _bad_depth_probe(KeepLast):
    return [attempt(KeepLast, *args) for args in _BAD_DEPTHS]


def _bad_depth_judge(raw):
    expect_each_raised("KeepLast", _BAD_DEPTHS, raw, "ValueError",
                       "a queue must keep at least one message")


register(
    Exercise(
        id="17.3",
        title="A topic with a bounded queue (KEEP_LAST)",
        target="KeepLast",
        task="the KEEP_LAST queue",
        forbidden=("mlsys_lab.robotics.runtime",),
        cases=(
            Case("a burst longer than depth: the newest survive", 2,
                 feedback="when full, drop the oldest message and keep the new one",
                 probe=_probe("burst"), judge=_judge("burst", "a burst")),
            Case("depth 1: always the latest", 1,
                 feedback="depth k keeps exactly k messages",
                 probe=_probe("depth one"), judge=_judge("depth one", "depth 1")),
            Case("pushes and pops interleaved", 2,
                 feedback="pop the oldest kept message; push returns what it dropped",
                 probe=_probe("mixed"), judge=_judge("mixed", "60 random pushes and pops")),
            Case("two queues keep their own messages", 0.5,
                 feedback="keep the messages on the instance, not the class",
                 probe=_two_queues_probe, judge=_two_queues_judge),
            Case("a slow subscriber sees the newest messages", 1,
                 feedback="a subscriber that falls behind should lose the oldest",
                 probe=_subscriber_probe, judge=_subscriber_judge),
            Case("depth < 1 raises ValueError", 0.5,
                 feedback="raise ValueError for a depth below 1",
                 probe=_bad_depth_probe, judge=_bad_depth_judge),
        ),
    ),
)
