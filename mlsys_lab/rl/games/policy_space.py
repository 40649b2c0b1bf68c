"""How the space a multi-agent learner searches grows with the number of agents.

With ``n`` agents each choosing among ``A`` actions, one joint action is one of ``A ** n``;
a deterministic policy of one agent over ``S`` observable states is one of ``A ** S``; the
joint deterministic policies of ``n`` agents number ``A ** (S * n)`` — and if each agent's
state includes the others' positions (``S`` itself grows as ``s ** n``), faster still. Exact
Python integers, so the numbers can be printed as they are.
"""

from ...errors import ArgumentError


def _positive(where, **values):
    for name, v in values.items():
        if int(v) != v or v < 1:
            raise ArgumentError(f"{where}: {name} must be a positive integer, got {v!r}")


def joint_actions(actions, agents):
    """``actions ** agents``: the joint actions of ``agents`` agents."""
    _positive("joint_actions", actions=actions, agents=agents)
    return int(actions) ** int(agents)


def deterministic_policies(states, actions):
    """``actions ** states``: one agent's deterministic policies over ``states`` states."""
    _positive("deterministic_policies", states=states, actions=actions)
    return int(actions) ** int(states)


def joint_policies(states, actions, agents, shared_state=False):
    """The joint deterministic policies of ``agents`` agents.

    Args:
        states: states each agent observes on its own (``shared_state=False``), or the states
            of one agent's own part of the world (``shared_state=True``: every agent observes
            all agents' parts, ``states ** agents`` states).
        actions: actions per agent.
        agents: how many agents.

    Returns:
        ``actions ** (S * agents)`` with ``S`` the states one agent's policy maps.
    """
    _positive("joint_policies", states=states, actions=actions, agents=agents)
    s = int(states) ** int(agents) if shared_state else int(states)
    return int(actions) ** (s * int(agents))
