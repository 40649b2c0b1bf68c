"""What several exercises of chapter 4 share."""

from __future__ import annotations

import importlib.util


def optional(*specs: str) -> tuple[str, ...]:
    """The specs whose top-level package is installed (networkx is not a dependency)."""
    return tuple(s for s in specs if importlib.util.find_spec(s.split(".")[0]) is not None)
