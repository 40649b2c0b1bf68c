"""Federated learning (chapter 14, 联邦学习系统): FedAvg and friends on simulated clients,
differential privacy with an accountant, SignDS. The map is ``README.md`` beside this file.

    from mlsys_lab import federated as fl
    x_tr, y_tr, x_te, y_te = fl.load_digits()
    clients = fl.ClientData(x_tr, y_tr, fl.partition.dirichlet(y_tr, 20, alpha=0.1))
    server = fl.Server(fl.strategies.FedAvg(fraction_fit=0.5), clients, fl.model.init_mlp())
    server.fit(10)

Secure aggregation and vertical FL live in ``federated.crypto`` and ``federated.vertical``
(imported on their own).
"""

from . import accountant, model, partition, privacy, signds, strategies, training
from .data import load_digits
from .fleet import Fleet
from .server import ClientData, RoundRecord, Server
from .simulation import RoundTiming, simulate_round
from .strategies import FedAdam, FedAvg, FedAvgM, FedProx, FitIns, FitRes, Strategy
from .training import centralised

__all__ = ["ClientData", "FedAdam", "FedAvg", "FedAvgM", "FedProx", "FitIns", "FitRes", "Fleet",
           "RoundRecord", "RoundTiming", "Server", "Strategy", "accountant", "centralised",
           "load_digits", "model", "partition", "privacy", "signds", "simulate_round",
           "strategies", "training"]
