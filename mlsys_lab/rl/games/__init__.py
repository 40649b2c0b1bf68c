"""Multi-agent learning on matrix games (book chapter 15).

    dynamics      best_response, naive_self_play, fictitious_play, multiplicative_weights,
                  exploitability
    policy_space  joint_actions, deterministic_policies, joint_policies: growth with agents
"""

from .dynamics import (
    TIE_TOL,
    best_response,
    exploitability,
    fictitious_play,
    multiplicative_weights,
    naive_self_play,
)
from .policy_space import deterministic_policies, joint_actions, joint_policies

__all__ = [
    "TIE_TOL", "best_response", "deterministic_policies", "exploitability", "fictitious_play",
    "joint_actions", "joint_policies", "multiplicative_weights", "naive_self_play",
]
