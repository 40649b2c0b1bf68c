"""Regenerate ``tests/data/torch_reference.npz``: PyTorch's answers for the conformance cases.

Run from the repository root where torch is installed (CI never needs torch)::

    python tests/data/make_torch_reference.py

For every case of ``tests/conformance.py`` that has a PyTorch function and no documented
divergence, it stores under ``"<case id>::<what>"``: ``out`` (the forward result), ``grad<i>``
(the gradient of ``sum(out * u)`` for each differentiable input, ``u`` the case's cotangent) and
``digest`` (a fingerprint of the inputs, so the tests notice a stale file). Arrays only, no
pickle; compressed.

It also writes ``tests/data/torch_mha_reference.npz``: ``torch.nn.MultiheadAttention`` on seeded
weights and inputs (:data:`MHA_CASES`), stored with its inputs, weights and options (JSON), so
``tests/nn/test_attention.py`` loads the same weights into ``ml.nn.MultiheadAttention`` without
torch.
"""

import json
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


MHA_NPZ = os.path.join(HERE, "torch_mha_reference.npz")

#: name -> (module options, forward options, (N, L, S), masks to draw). Masks: "kpm" a bool
#: key_padding_mask, "bool" a bool (L, S) attn_mask, "float_heads" a float (N*H, L, S) one,
#: "causal" the causal bool mask with is_causal=True (ours gets only is_causal=True).
MHA_CASES = {
    "self_weights": (dict(embed_dim=8, num_heads=2), dict(need_weights=True), (2, 5, 5), ()),
    "cross_kdim_vdim_masks": (dict(embed_dim=8, num_heads=4, kdim=6, vdim=3),
                              dict(need_weights=False), (3, 4, 6), ("kpm", "bool")),
    "float_mask_per_head_weights": (dict(embed_dim=6, num_heads=3),
                                    dict(need_weights=True, average_attn_weights=False),
                                    (2, 4, 4), ("kpm", "float_heads")),
    "causal": (dict(embed_dim=8, num_heads=2), dict(need_weights=False), (2, 6, 6),
               ("causal",)),
    "sequence_first_no_bias": (dict(embed_dim=4, num_heads=2, batch_first=False, bias=False),
                               dict(need_weights=False), (2, 3, 5), ()),
}


def mha_answers():
    """``{name::what: array}`` for :data:`MHA_CASES`, torch's module in float32."""
    out = {}
    for c, (name, (mod, fwd, (n, L, S), masks)) in enumerate(MHA_CASES.items()):
        r = np.random.default_rng(100 + c)
        e, h = mod["embed_dim"], mod["num_heads"]
        kdim, vdim = mod.get("kdim", e), mod.get("vdim", e)
        bias = mod.get("bias", True)
        m = torch.nn.MultiheadAttention(e, h, bias=bias, kdim=mod.get("kdim"),
                                        vdim=mod.get("vdim"),
                                        batch_first=mod.get("batch_first", True),
                                        dtype=torch.float32)
        w = {"q_proj.weight": r.standard_normal((e, e)), "k_proj.weight": r.standard_normal(
             (kdim, e)), "v_proj.weight": r.standard_normal((vdim, e)),
             "out_proj.weight": r.standard_normal((e, e))}
        if bias:
            w.update({f"{p}.bias": r.standard_normal(e) for p in ("q_proj", "k_proj", "v_proj",
                                                                   "out_proj")})
        w = {k: (0.4 * v).astype(np.float32) for k, v in w.items()}
        sd = m.state_dict()
        with torch.no_grad():
            t = lambda a: torch.from_numpy(a.T.copy())  # noqa: E731 - ours are (in, out)
            if "in_proj_weight" in sd:
                m.in_proj_weight.copy_(torch.cat([t(w[f"{p}_proj.weight"]) for p in "qkv"]))
            else:
                m.q_proj_weight.copy_(t(w["q_proj.weight"]))
                m.k_proj_weight.copy_(t(w["k_proj.weight"]))
                m.v_proj_weight.copy_(t(w["v_proj.weight"]))
            m.out_proj.weight.copy_(t(w["out_proj.weight"]))
            if bias:
                m.in_proj_bias.copy_(torch.from_numpy(np.concatenate(
                    [w[f"{p}_proj.bias"] for p in "qkv"])))
                m.out_proj.bias.copy_(torch.from_numpy(w["out_proj.bias"]))
        first = mod.get("batch_first", True)
        shape = (lambda b, t_, f: (b, t_, f)) if first else (lambda b, t_, f: (t_, b, f))
        x = {"query": r.standard_normal(shape(n, L, e)), "key": r.standard_normal(
             shape(n, S, kdim)), "value": r.standard_normal(shape(n, S, vdim))}
        x = {k: v.astype(np.float32) for k, v in x.items()}
        kw = dict(fwd)
        if "kpm" in masks:
            kpm = r.random((n, S)) < 0.3
            kpm[:, 0] = False
            x["key_padding_mask"] = kpm
        if "bool" in masks:
            am = r.random((L, S)) < 0.3
            am[:, 1] = False
            x["attn_mask"] = am
        if "float_heads" in masks:
            x["attn_mask"] = r.standard_normal((n * h, L, S)).astype(np.float32)
        if "causal" in masks:
            x["attn_mask"] = np.triu(np.ones((L, S), bool), 1)
            kw["is_causal"] = True
        m.eval()
        args = {k: torch.from_numpy(v) for k, v in x.items()}
        y, att = m(args.pop("query"), args.pop("key"), args.pop("value"), **args, **kw)
        ours_kw = dict(kw)
        if "causal" in masks:
            x.pop("attn_mask")
        res = {"out": y.detach().numpy(), "module": np.array(json.dumps(mod)),
               "forward": np.array(json.dumps(ours_kw))}
        if att is not None:
            res["weights"] = att.detach().numpy()
        res.update({f"input.{k}": v for k, v in x.items()})
        res.update({f"param.{k}": v for k, v in w.items()})
        out.update({f"{name}::{k}": v for k, v in res.items()})
    return out


def main():
    mha = mha_answers()
    np.savez_compressed(MHA_NPZ, **mha)
    print(f"wrote {len(mha)} arrays for {len(MHA_CASES)} MultiheadAttention cases to {MHA_NPZ} "
          f"({os.path.getsize(MHA_NPZ)} bytes)")
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
