"""``mlsys-lab open``: JupyterLab at the project root, on the start page ``index.ipynb``, so the
chapters, the exercises and the solutions are all one click away."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from .catalogue import project_root

__all__ = ["lab_command", "open_lab"]


def lab_command(root: Path, extra=()) -> list[str]:
    """The command that starts JupyterLab serving ``root`` and opening its ``index.ipynb``
    (``extra`` arguments go to ``jupyter lab``)."""
    root = Path(root).resolve()
    page = ["index.ipynb"] if (root / "index.ipynb").is_file() else []
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", *extra, *page]


def open_lab(extra=(), root: Path | None = None, call=subprocess.call) -> int:
    """Start JupyterLab at the project root (blocks until it stops); returns its exit code."""
    if importlib.util.find_spec("jupyterlab") is None:
        print("mlsys-lab open: JupyterLab is not installed; fix: pip install jupyterlab",
              file=sys.stderr)
        return 1
    root = project_root(root)
    return call(lab_command(root, extra), cwd=str(root))
