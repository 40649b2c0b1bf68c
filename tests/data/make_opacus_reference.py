"""Regenerate ``tests/data/opacus_rdp_reference.npz``: Opacus's RDP accountant over a grid.

Run from the repository root where Opacus is installed (CI never needs it)::

    python tests/data/make_opacus_reference.py

Written with Opacus 1.6.0 (the version is also stored in the file, ``opacus_version``). For
each sampling rate ``q``, noise multiplier ``sigma``, number of steps and ``delta`` of the grid
below it stores what ``opacus.accountants.RDPAccountant`` reports with its default orders
(``RDPAccountant.DEFAULT_ALPHAS``) and its RDP-to-(epsilon, delta) conversion
(``get_privacy_spent``): ``epsilon[q, sigma, steps, delta]`` and ``best_order[...]``; and the
per-order RDP of one step, ``rdp[q, sigma, order]`` (``privacy_analysis.compute_rdp``).
``tests/federated/test_accountant.py`` compares ``mlsys_lab.federated.accountant`` with it.
Arrays only, no pickle.
"""

import os
import warnings

import numpy as np
import opacus
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "opacus_rdp_reference.npz")

Q = [0.001, 0.004, 0.01, 0.05, 0.1, 1.0]
SIGMA = [0.5, 0.8, 1.0, 1.5, 3.0, 10.0]
STEPS = [1, 100, 1000, 10000]
DELTA = [1e-5, 1e-3]


def main():
    orders = np.array(RDPAccountant.DEFAULT_ALPHAS, dtype=np.float64)
    eps = np.zeros((len(Q), len(SIGMA), len(STEPS), len(DELTA)))
    best = np.zeros_like(eps)
    rdp = np.zeros((len(Q), len(SIGMA), len(orders)))
    for a, q in enumerate(Q):
        for b, sigma in enumerate(SIGMA):
            rdp[a, b] = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                                     orders=list(orders))
            for c, steps in enumerate(STEPS):
                for d, delta in enumerate(DELTA):
                    acc = RDPAccountant()
                    acc.history = [(sigma, q, steps)]   # (noise_multiplier, sample_rate, steps)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # "optimal order is the largest alpha"
                        eps[a, b, c, d], best[a, b, c, d] = acc.get_privacy_spent(delta=delta)
    np.savez_compressed(OUT, q=np.array(Q), sigma=np.array(SIGMA), steps=np.array(STEPS),
                        delta=np.array(DELTA), orders=orders, epsilon=eps, best_order=best,
                        rdp=rdp, opacus_version=np.array(opacus.__version__))
    print(f"wrote {OUT} (Opacus {opacus.__version__}): {eps.size} epsilons, "
          f"{rdp.size} RDP values")


if __name__ == "__main__":
    main()
