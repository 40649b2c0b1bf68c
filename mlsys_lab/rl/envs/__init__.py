"""Environments in Gymnasium's shape (book chapter 15).

    core           Env: reset -> (obs, info), step -> (obs, reward, terminated, truncated, info)
    seeding        np_random: Gymnasium's seed -> PCG64 generator
    spaces         Box, Discrete, MultiDiscrete
    cartpole       CartPole: CartPole-v1's dynamics, termination, 500-step truncation, seeding
    gridworld      GridWorld (with its transition model) and value_iteration
    matrix_games   MatrixGame, ROCK_PAPER_SCISSORS, PRISONERS_DILEMMA, MatrixGameEnv
"""

from .cartpole import CartPole, cartpole_dynamics
from .core import Env
from .gridworld import GridWorld, value_iteration
from .matrix_games import (
    PRISONERS_DILEMMA,
    ROCK_PAPER_SCISSORS,
    MatrixGame,
    MatrixGameEnv,
    pure_nash_equilibria,
)
from .seeding import np_random
from .spaces import Box, Discrete, MultiDiscrete, Space

__all__ = [
    "PRISONERS_DILEMMA", "ROCK_PAPER_SCISSORS", "Box", "CartPole", "Discrete", "Env",
    "GridWorld", "MatrixGame", "MatrixGameEnv", "MultiDiscrete", "Space", "cartpole_dynamics",
    "np_random", "pure_nash_equilibria", "value_iteration",
]
