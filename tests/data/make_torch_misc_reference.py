"""Regenerate ``tests/data/torch_misc_reference.npz``: PyTorch's answers for the tests that
compare single library features with it (dtype promotion, sparse optimizers, ``embedding_bag``,
``DistributedSampler``), so those tests run where torch is not installed (CI never installs it).

Run from the repository root where torch is installed::

    python tests/data/make_torch_misc_reference.py

Inputs are stored beside the answers (the tests read both), arrays only, no pickle; compressed.
Keys: ``promotion::*`` (the 9 x 9 table of ``torch.promote_types``), ``sparse_opt::*``
(``torch.optim.SparseAdam`` and ``Adagrad`` after five sparse steps), ``bag::<mode>::*`` and
``psw::*`` (``F.embedding_bag`` forward and gradients), ``sampler::<drop_last>::*``
(``torch.utils.data.DistributedSampler(shuffle=False)`` for every n < 25, replicas 1-5, rank:
the indices concatenated in that loop order, with each list's length).
"""

import os

import numpy as np
import torch
import torch.utils.data as torch_data

HERE = os.path.dirname(os.path.abspath(__file__))
NPZ = os.path.join(HERE, "torch_misc_reference.npz")
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def promotion():
    table = [[str(torch.promote_types(getattr(torch, a), getattr(torch, b))).split(".")[1]
              for b in DTYPES] for a in DTYPES]
    try:
        torch.promote_types(torch.uint16, torch.int8)
        raises = False
    except RuntimeError:
        raises = True
    return {"promotion::names": np.array(DTYPES), "promotion::table": np.array(table),
            "promotion::uint16_int8_raises": np.array(raises)}


def sparse_optimizers():
    w0 = np.random.default_rng(5).standard_normal((8, 3))
    r = np.random.default_rng(6)
    grads = [(r.integers(0, 8, 4), r.standard_normal((4, 3))) for _ in range(5)]
    out = {"sparse_opt::w0": w0}
    for i, (rows, vals) in enumerate(grads):
        out[f"sparse_opt::rows{i}"], out[f"sparse_opt::vals{i}"] = rows, vals
    for name, cls, hyper in (("SparseAdam", torch.optim.SparseAdam,
                              dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6)),
                             ("Adagrad", torch.optim.Adagrad,
                              dict(lr=0.2, lr_decay=0.05, eps=1e-10))):
        tp = torch.nn.Parameter(torch.tensor(w0.copy()))
        opt = cls([tp], **hyper)
        for rows, vals in grads:
            tp.grad = torch.sparse_coo_tensor(torch.tensor(rows)[None], torch.tensor(vals),
                                              (8, 3), check_invariants=True)
            opt.step()
        out[f"sparse_opt::{name}"] = tp.detach().numpy().copy()
    return out


def embedding_bags():
    r = np.random.default_rng(9)
    w0 = r.standard_normal((8, 3))
    ids, offsets = np.array([3, 3, 0, 7, 1, 3]), np.array([0, 2, 2, 5])  # bag 1 is empty
    gout = r.standard_normal((4, 3))
    out = {"bag::w0": w0, "bag::ids": ids, "bag::offsets": offsets, "bag::gout": gout}
    for mode in ("sum", "mean"):
        tw = torch.tensor(w0, requires_grad=True)
        ty = torch.nn.functional.embedding_bag(torch.tensor(ids), tw, torch.tensor(offsets),
                                               mode=mode, sparse=True)
        (ty * torch.tensor(gout)).sum().backward()
        out[f"bag::{mode}::out"] = ty.detach().numpy().copy()
        out[f"bag::{mode}::grad"] = tw.grad.to_dense().numpy().copy()
    r = np.random.default_rng(4)
    w0 = r.standard_normal((9, 3))
    ids = np.array([1, 8, 8, 0, 3, 3, 3])
    offsets = np.array([0, 3, 3, 7])  # an empty bag, and include_last_offset's closing entry
    psw0 = r.standard_normal(7)
    gout = r.standard_normal((3, 3))
    tw = torch.tensor(w0, requires_grad=True)
    tp = torch.tensor(psw0, requires_grad=True)
    ty = torch.nn.functional.embedding_bag(torch.tensor(ids), tw, torch.tensor(offsets),
                                           mode="sum", sparse=True, per_sample_weights=tp,
                                           include_last_offset=True)
    ty.backward(torch.tensor(gout))
    out.update({"psw::w0": w0, "psw::ids": ids, "psw::offsets": offsets, "psw::psw0": psw0,
                "psw::gout": gout, "psw::out": ty.detach().numpy().copy(),
                "psw::wgrad": tw.grad.to_dense().numpy().copy(),
                "psw::pgrad": tp.grad.numpy().copy()})
    return out


def samplers():
    out = {}
    for drop_last in (False, True):
        indices, lengths = [], []
        for n in range(0, 25):
            for replicas in range(1, 6):
                for rank in range(replicas):
                    got = list(torch_data.DistributedSampler(range(n), replicas, rank,
                                                             shuffle=False, drop_last=drop_last))
                    indices += got
                    lengths.append(len(got))
        out[f"sampler::{drop_last}::indices"] = np.array(indices, np.int64)
        out[f"sampler::{drop_last}::lengths"] = np.array(lengths, np.int64)
    return out


def main():
    arrays = {**promotion(), **sparse_optimizers(), **embedding_bags(), **samplers()}
    np.savez_compressed(NPZ, **arrays)
    print(f"wrote {NPZ}: {len(arrays)} arrays, torch {torch.__version__}")


if __name__ == "__main__":
    main()
