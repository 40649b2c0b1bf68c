"""``mlsys-lab doctor``: what this machine has for the chapters, and how to fix what it lacks.

Each :class:`Check` says whether a piece is there, what was found, whether the chapters need it
(``required``) or only some of them (an optional piece falls back: no ``dot`` -> matplotlib
drawings, no GPU -> the CUDA simulator, ...), and the command that installs it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Check", "checks", "report", "run_doctor"]

APT = "$(command -v sudo) apt-get install -y"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report."""

    name: str
    ok: bool
    found: str
    required: bool
    fix: str
    note: str = ""


def _module(name: str, dist: str | None = None) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:
        return None
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(dist or name)
        except importlib.metadata.PackageNotFoundError:
            version = "installed"
    return str(version)


def _python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("Python", ok, f"{sys.version.split()[0]} ({sys.executable})", True,
                 f"{APT} python3 python3-venv  (or: conda create -n mlsys-lab python=3.11)",
                 "3.10 or newer")


def _package(label: str, module: str, dist: str, required: bool, note: str = "") -> Check:
    version = _module(module, dist)
    return Check(label, version is not None, version or "not installed", required,
                 f'pip install -e ".[dev]"  (or: pip install {dist})', note)


def _dot() -> Check:
    path = shutil.which("dot")
    found = "not found"
    if path:
        try:
            out = subprocess.run([path, "-V"], capture_output=True, text=True, timeout=10)
            found = (out.stderr or out.stdout).strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            found = path
    return Check("Graphviz dot", path is not None, found, False,
                 f"{APT} graphviz  (or: conda install -c conda-forge graphviz)",
                 "without it graphs are drawn with matplotlib")


def _cuda() -> Check:
    """An NVIDIA GPU is optional: chapter 8 (and its exercises) switch on Numba's CUDA simulator
    in their first cell, so the CUDA kernels run (slowly, in Python) without one."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return Check("CUDA", True, "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)", False,
                     "", "the chapters' CUDA kernels run in the simulator")
    found, ok = "no NVIDIA GPU or driver found", False
    try:
        from numba import cuda

        if cuda.is_available():
            name = cuda.get_current_device().name
            ok = True
            found = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    except Exception as error:  # a broken driver is reported, not raised
        found = f"numba.cuda unavailable ({type(error).__name__})"
    return Check("CUDA", ok, found, False,
                 "nothing to do: chapter 8 runs its CUDA kernels in Numba's simulator by "
                 "itself; for real GPU timings use a machine with an NVIDIA GPU and driver",
                 "optional: real GPU timings in chapter 8" if not ok else
                 "chapter 8's GPU ladder (its first cell picks the simulator; set "
                 "NUMBA_ENABLE_CUDASIM=0 there to use this GPU)")


#: Debian/Ubuntu's package of CJK fonts (Noto Sans/Serif CJK); Chromium shows empty boxes for
#: the chapters' Chinese names (计算图) without some Chinese font.
CJK_PACKAGE = "fonts-noto-cjk"


def _cjk_font() -> Check:
    """Whether fontconfig knows a font with Chinese glyphs (``fc-list :lang=zh``). Chromium on
    Linux draws text through fontconfig; macOS and Windows ship Chinese fonts."""
    fix = f"{APT} {CJK_PACKAGE}"
    note = "the chapters' Chinese names in Chromium and in exported pages"
    if not sys.platform.startswith("linux"):
        return Check("Chinese font", True, f"the system's fonts ({sys.platform})", False, fix, "")
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return Check("Chinese font", False, "fontconfig's fc-list not found", False,
                     f"{APT} fontconfig {CJK_PACKAGE}", note)
    try:
        out = subprocess.run([fc_list, ":lang=zh", "family"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        return Check("Chinese font", False, f"fc-list failed ({type(error).__name__})", False,
                     fix, note)
    families = sorted({line.split(",")[0].strip() for line in out.splitlines() if line.strip()},
                      key=lambda name: (" SC" not in name, name))   # Simplified Chinese first
    if not families:
        return Check("Chinese font", False, "none (fc-list :lang=zh lists no font): Chinese "
                     "names show as empty boxes", False, fix, note)
    more = f" and {len(families) - 1} more" if len(families) > 1 else ""
    return Check("Chinese font", True, families[0] + more, False, fix, "")


def _mpi() -> Check:
    version = _module("mpi4py")
    mpiexec = None
    if version is not None:
        try:
            from mlsys_lab.distributed.mpi import find_mpiexec

            mpiexec = find_mpiexec()
        except Exception:
            mpiexec = shutil.which("mpiexec")
    ok = version is not None and mpiexec is not None
    found = (f"mpi4py {version}, mpiexec {mpiexec}" if ok else
             "mpi4py not installed" if version is None else "mpi4py installed, no mpiexec")
    return Check("MPI", ok, found, False, "pip install mpich mpi4py  (in the dev extra)",
                 "chapter 11's real multi-process runs")


def _browser() -> Check:
    from .browser import INSTALL_HINT, BrowserNotFound, find_browser

    try:
        browser, driver = find_browser()
    except BrowserNotFound:
        return Check("browser", False, "no Chromium/chromedriver", False,
                     INSTALL_HINT.replace("install Chromium and its driver: ", ""),
                     "the browser tests and checking exported pages")
    return Check("browser", True, f"{browser}, {driver}", False, "", "")


def checks() -> list[Check]:
    """Every check, in the order the report prints them."""
    return [
        _python(),
        _package("numpy", "numpy", "numpy", True),
        _package("numba", "numba", "numba", True),
        _package("JupyterLab", "jupyterlab", "jupyterlab", True),
        _package("ipywidgets", "ipywidgets", "ipywidgets", True, "sliders and pickers"),
        _package("matplotlib", "matplotlib", "matplotlib", True),
        _dot(),
        _cuda(),
        _mpi(),
        _browser(),
        _cjk_font(),
    ]


def report(found: list[Check]) -> str:
    """The checks as the text ``mlsys-lab doctor`` prints."""
    lines = []
    for c in found:
        mark = "ok  " if c.ok else ("MISSING" if c.required else "absent (optional)")
        lines.append(f"{mark:<18} {c.name:<13} {c.found}" + (f"  — {c.note}" if c.note else ""))
        if not c.ok:
            lines.append(f"{'':<18} {'fix:':<13} {c.fix}")
    missing = [c.name for c in found if c.required and not c.ok]
    lines.append("")
    lines.append("everything the chapters need is here" if not missing else
                 f"missing for the chapters: {', '.join(missing)}")
    return "\n".join(lines)


def run_doctor() -> int:
    """Print the report; exit code 1 when something required is missing, else 0."""
    found = checks()
    print(report(found))
    return 1 if any(c.required and not c.ok for c in found) else 0
