"""``mlsys-lab open``: JupyterLab at the project root, on the start page ``index.ipynb``, so the
chapters, the exercises and the solutions are all one click away.

As root (effective uid 0, as in a container) Jupyter refuses to start unless told
``--allow-root``; the command passes it then, so the README's set-up works as root too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from .catalogue import project_root

__all__ = ["lab_command", "open_lab"]


def _is_root() -> bool:
    """Whether this process runs with effective uid 0 (False where there are no uids)."""
    geteuid = getattr(os, "geteuid", None)
    return geteuid is not None and geteuid() == 0


def lab_command(root: Path, extra=()) -> list[str]:
    """The command that starts JupyterLab serving ``root`` and opening its ``index.ipynb``
    (``extra`` arguments go to ``jupyter lab``; ``--allow-root`` is added when running as
    root, where Jupyter refuses to start without it)."""
    root = Path(root).resolve()
    page = ["index.ipynb"] if (root / "index.ipynb").is_file() else []
    extra = list(extra)
    allow = ["--allow-root"] if _is_root() and "--allow-root" not in extra else []
    return [sys.executable, "-m", "jupyterlab", *allow, f"--ServerApp.root_dir={root}", *extra,
            *page]


def open_lab(extra=(), root: Path | None = None, call=subprocess.call) -> int:
    """Start JupyterLab at the project root (blocks until it stops); returns its exit code."""
    if importlib.util.find_spec("jupyterlab") is None:
        print("mlsys-lab open: JupyterLab is not installed; fix: pip install jupyterlab",
              file=sys.stderr)
        return 1
    root = project_root(root)
    return call(lab_command(root, extra), cwd=str(root))
