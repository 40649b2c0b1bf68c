"""Teaching cryptography for federated learning (chapter 14, 联邦学习系统): Diffie–Hellman,
a seeded mask PRG, Shamir sharing, secure aggregation (Bonawitz et al. 2017), RSA blind-signature
PSI and Paillier. Pure Python integers; small keys; no constant-time arithmetic — see README.md.
"""

from mlsys_lab.federated.crypto import dh, paillier, prg, primes, psi, rsa, secure_agg, shamir

__all__ = ["dh", "paillier", "prg", "primes", "psi", "rsa", "secure_agg", "shamir"]
