"""Regenerate ``tests/data/torch_reference.npz``: PyTorch's answers for the conformance cases.

Run from the repository root where torch is installed (CI never needs torch)::

    python tests/data/make_torch_reference.py

For every case of ``tests/conformance.py`` that has a PyTorch function and no documented
divergence, it stores under ``"<case id>::<what>"``: ``out`` (the forward result), ``grad<i>``
(the gradient of ``sum(out * u)`` for each differentiable input, ``u`` the case's cotangent) and
``digest`` (a fingerprint of the inputs, so the tests notice a stale file). Arrays only, no
pickle; compressed.
"""

import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests import conformance as C  # noqa: E402


def torch_answers(case):
    """``{what: array}`` for one case, computed by PyTorch in the case's dtypes."""
    ts = []
    for i, a in enumerate(case.inputs):
        t = torch.from_numpy(np.array(a, copy=True))
        if i in case.diff:
            t.requires_grad_(True)
        ts.append(t)
    out = case.torch(torch, *ts)
    res = {"out": out.detach().numpy().copy(), "digest": np.array(C.digest(case))}
    if case.diff:
        u = C.cotangent(case, C.out_shape(case))
        assert tuple(out.shape) == u.shape, f"{case.id}: torch gives shape {tuple(out.shape)}"
        (out.to(torch.float64) * torch.from_numpy(u)).sum().backward()
        for i in case.diff:
            g = ts[i].grad
            res[f"grad{i}"] = np.zeros(case.inputs[i].shape) if g is None else \
                g.to(torch.float64).numpy().copy()
    return res


def main():
    torch.set_default_dtype(torch.float64)
    arrays, failed = {}, []
    for case in C.torch_cases():
        try:
            answers = torch_answers(case)
        except Exception as e:  # report, and leave the case without an answer
            failed.append(f"{case.id}: {type(e).__name__}: {e}")
            continue
        arrays.update({f"{case.id}::{k}": v for k, v in answers.items()})
    np.savez_compressed(C.TORCH_NPZ, **arrays)
    print(f"wrote {len(arrays)} arrays for {len(C.torch_cases()) - len(failed)} cases to "
          f"{C.TORCH_NPZ} ({os.path.getsize(C.TORCH_NPZ)} bytes), torch {torch.__version__}")
    for line in failed:
        print("  no answer:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
