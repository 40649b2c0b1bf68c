"""Regenerate ``tests/data/control_reference.npz``: SciPy's and python-control's answers for the
robotics tests (chapter 17). CI never needs either library; run from the repository root::

    python tests/data/make_control_reference.py

Stored (float64, no pickle):

* ``lqr/<i>/{A,B,Q,R}`` — twelve random discrete systems (n = 2..5 states, m = 1..2 inputs),
  half of them open-loop stable (spectral radius 0.5..0.95) and half unstable (1.05..1.6);
  ``lqr/<i>/P_scipy`` (``scipy.linalg.solve_discrete_are``), ``lqr/<i>/K_scipy``
  (``(R + BᵀPB)⁻¹BᵀPA`` from it) and ``lqr/<i>/K_control`` (``control.dlqr``'s gain);
* ``zoh/{A,B,dt,Ad,Bd}`` — the cart-pole's linearisation discretised by
  ``scipy.signal.cont2discrete(method="zoh")``; ``expm/<i>/{M,E}`` — ``scipy.linalg.expm``;
* ``qp/<i>/{x0,u_max,H,g,C,lo,hi,z,f}`` — eight MPC QPs of the cart-pole with input and state limits
  (``mlsys_lab.robotics.mpc.MPC.qp`` builds them) and their optimum found by
  ``scipy.optimize.minimize(method="SLSQP")`` at ``ftol=1e-15``, then polished by SciPy's
  ``lstsq`` on the optimum's active set (the reference solver's answer, independent of the
  library's ADMM).
"""

import os
import sys

import control
import numpy as np
import scipy
from scipy.linalg import expm, solve_discrete_are
from scipy.optimize import minimize
from scipy.signal import cont2discrete

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from mlsys_lab.robotics.dynamics import CartPole  # noqa: E402


def random_system(rng, n, m, radius):
    a = rng.standard_normal((n, n))
    a *= radius / np.abs(np.linalg.eigvals(a)).max()
    b = rng.standard_normal((n, m))
    c = rng.standard_normal((n, n))
    q = c.T @ c / n + 0.1 * np.eye(n)
    d = rng.standard_normal((m, m))
    r = d.T @ d / m + 0.5 * np.eye(m)
    return a, b, q, r


def lqr_cases(out):
    rng = np.random.default_rng(1701)
    for i in range(12):
        n, m = 2 + i % 4, 1 + (i // 4) % 2
        radius = rng.uniform(0.5, 0.95) if i % 2 == 0 else rng.uniform(1.05, 1.6)
        a, b, q, r = random_system(rng, n, m, radius)
        p = solve_discrete_are(a, b, q, r)
        k = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        kc, _, _ = control.dlqr(a, b, q, r)
        for name, v in dict(A=a, B=b, Q=q, R=r, P_scipy=p, K_scipy=k,
                            K_control=np.asarray(kc)).items():
            out[f"lqr/{i}/{name}"] = v


def zoh_cases(out):
    a, b = CartPole().linearize()
    dt = 0.02
    ad, bd, *_ = cont2discrete((a, b, np.eye(4), np.zeros((4, 1))), dt, method="zoh")
    out.update({"zoh/A": a, "zoh/B": b, "zoh/dt": np.array(dt), "zoh/Ad": ad, "zoh/Bd": bd})
    rng = np.random.default_rng(17)
    for i, scale in enumerate([0.1, 1.0, 5.0, 30.0]):
        m = rng.standard_normal((5, 5)) * scale / np.sqrt(5)
        out[f"expm/{i}/M"], out[f"expm/{i}/E"] = m, expm(m)


def qp_reference(h, g, c, lo, hi):
    cons = [{"type": "ineq", "fun": lambda z: c @ z - lo, "jac": lambda z: c},
            {"type": "ineq", "fun": lambda z: hi - c @ z, "jac": lambda z: -c}]
    res = minimize(lambda z: 0.5 * z @ h @ z + g @ z, np.zeros(len(g)),
                   jac=lambda z: h @ z + g, constraints=cons, method="SLSQP",
                   options={"ftol": 1e-15, "maxiter": 1000})
    z = res.x
    # polish on the active set: solve the equality-constrained QP's KKT system
    s = c @ z
    active = np.flatnonzero((np.abs(s - lo) < 1e-7) | (np.abs(s - hi) < 1e-7))
    bound = np.where(np.abs(s - lo) < np.abs(s - hi), lo, hi)[active]
    ca = c[active]
    n, k = len(g), len(active)
    kkt = np.block([[h, ca.T], [ca, np.zeros((k, k))]])
    sol = np.linalg.lstsq(kkt, np.concatenate([-g, bound]), rcond=None)[0]
    z = sol[:n]
    return z, 0.5 * z @ h @ z + g @ z


def qp_cases(out):
    from mlsys_lab.robotics.mpc import cartpole_mpc
    cases = [(10.0, [0.0, 0.0, 0.25, 0.0]), (10.0, [0.5, -0.3, -0.2, 0.4]),
             (10.0, [0.8, 0.5, 0.1, 0.0]), (10.0, [0.0, 0.0, 0.05, 0.0]),
             (5.0, [0.0, 0.0, 0.3, 0.0]), (5.0, [0.8, 0.5, 0.1, 0.0]),
             (3.0, [-0.5, -1.0, -0.2, 0.5]), (3.0, [0.0, 0.0, 0.15, 0.3])]
    for i, (u_max, x0) in enumerate(cases):
        h, g, c, lo, hi = cartpole_mpc(horizon=20, u_max=u_max).qp(np.array(x0))
        z, f = qp_reference(h, g, c, lo, hi)
        for name, v in dict(x0=np.array(x0), u_max=np.array(u_max), H=h, g=g, C=c, lo=lo,
                            hi=hi, z=z, f=np.array(f)).items():
            out[f"qp/{i}/{name}"] = v


def main():
    out = {}
    lqr_cases(out)
    zoh_cases(out)
    if "--no-qp" not in sys.argv:
        qp_cases(out)
    path = os.path.join(HERE, "control_reference.npz")
    np.savez_compressed(path, **out)
    print(f"wrote {path}: {len(out)} arrays (scipy {scipy.__version__}, "
          f"control {control.__version__})")


if __name__ == "__main__":
    main()
