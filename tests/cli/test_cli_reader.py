"""The reader's commands (issue 17): README set-up lines as root and with sudo, with and without
conda; ``mlsys-lab open``/``--version``/``doctor``/``export``; the start page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import mlsys_lab
from mlsys_lab import cli
from mlsys_lab.notebook_format import normal_text
from mlsys_lab.reader import doctor, export, launch, start_page
from mlsys_lab.reader.catalogue import chapters, project_root

ROOT = project_root()
README = (ROOT / "README.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- README set-up
def _command_after(heading: str) -> str:
    part = README[README.index(heading):]
    return re.search(r"```bash\n(.+?)\n```", part, re.S).group(1).strip()


FAKE = {
    # Each fake records its arguments; python3 -m venv makes an activate script that puts the
    # venv's (fake) pip, python, jupyter and mlsys-lab first on PATH, as a real venv does.
    "apt-get": 'echo "apt-get $*" >> "$LOG"',
    "sudo": 'echo "sudo $1" >> "$LOG"; "$@"',
    "python3": 'if [ "$1 $2" = "-m venv" ]; then /bin/mkdir -p "$3/bin";'
               ' echo "PATH=$PWD/$3/bin:\\$PATH" > "$3/bin/activate";'
               ' for t in pip python jupyter mlsys-lab; do'
               ' printf "#!/bin/bash\\necho venv-$t \\$* >> \\"\\$LOG\\"\\n" > "$3/bin/$t";'
               ' /bin/chmod +x "$3/bin/$t"; done; fi; echo "python3 $*" >> "$LOG"',
    "conda": 'echo "conda $*" >> "$LOG"',
    "jupyter": 'echo "system-jupyter $*" >> "$LOG"',
    "mlsys-lab": 'echo "system-mlsys-lab $*" >> "$LOG"',
}


def _run_readme(command: str, tmp_path: Path, tools) -> list[str]:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in tools:
        (fake / name).write_text("#!/bin/bash\n" + FAKE[name] + "\n")
        (fake / name).chmod(0o755)
    log = tmp_path / "log"
    work = tmp_path / "clone"
    work.mkdir()
    done = subprocess.run(["/bin/bash", "-c", command], cwd=work, capture_output=True, text=True,
                          env={"PATH": str(fake), "LOG": str(log), "HOME": str(tmp_path)},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


@pytest.mark.parametrize("heading", ["**Open the chapters**", "**Run every test**"])
def test_readme_setup_runs_as_root_without_sudo(tmp_path, heading):
    command = _command_after(heading)
    assert not re.search(r"(^|&& )sudo ", command), "a bare sudo fails as root in a container"
    log = _run_readme(command, tmp_path, ["apt-get", "python3"])
    assert log[0] == "apt-get update" and log[1].startswith("apt-get install -y graphviz")
    assert "python3 -m venv .venv" in log and 'venv-pip install -e .[dev]' in log
    # `mlsys-lab open`, not `jupyter lab`: Jupyter refuses to start as root without
    # --allow-root, which `mlsys-lab open` adds there (test_open_as_root_allows_root).
    if "Open" in heading:
        assert log[-1] == "venv-mlsys-lab open"
    else:
        assert log[-1].startswith("venv-python -m pytest ")
        assert log[-1].endswith("--nbval-lax tests chapters")


@pytest.mark.parametrize("heading", ["**Open the chapters**", "**Run every test**"])
def test_readme_setup_uses_sudo_where_it_exists(tmp_path, heading):
    log = _run_readme(_command_after(heading), tmp_path, ["apt-get", "python3", "sudo"])
    assert log[:2] == ["sudo apt-get", "apt-get update"]
    assert sum(line.startswith("sudo ") for line in log) == 2          # both apt-get calls


def test_readme_test_command_installs_the_browser():
    assert "chromium chromium-driver" in _command_after("**Run every test**")


def test_readme_conda_route(tmp_path):
    log = _run_readme(_command_after("### The conda route"), tmp_path,
                      ["conda", "jupyter", "mlsys-lab"])
    assert log == ["conda env create -f environment.yml", "conda activate mlsys-lab",
                   "system-mlsys-lab open"]


def test_ci_script_installs_the_browser_as_root_or_with_sudo():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi' in ci and "chromium-driver" in ci
    apt = [line.strip() for line in ci.splitlines() if "apt-get" in line and
           not line.lstrip().startswith("#")]
    assert apt and all(line.startswith("$SUDO ") for line in apt), apt


# ----------------------------------------------------------------------------- the commands
def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"mlsys-lab {mlsys_lab.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{mlsys_lab.__version__}"' in pyproject


def test_open_starts_lab_at_the_root_on_the_start_page(monkeypatch):
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, cwd=None: calls.append((cmd, cwd)) or 0)
    monkeypatch.chdir(ROOT / "chapters")          # from anywhere inside the checkout, too
    assert cli.main(["open", "--", "--no-browser"]) == 0
    (cmd, cwd), = calls
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={ROOT.resolve()}" in cmd and cmd[-1] == "index.ipynb"
    assert "--no-browser" in cmd and Path(cwd) == ROOT.resolve()


def test_lab_command_without_a_start_page(tmp_path):
    cmd = launch.lab_command(tmp_path)
    assert cmd[-1] == f"--ServerApp.root_dir={tmp_path.resolve()}"


def _open_command(monkeypatch, euid: int, *args: str) -> list[str]:
    """The command `mlsys-lab open` runs when the effective uid is ``euid``."""
    calls = []
    monkeypatch.setattr(launch.os, "geteuid", lambda: euid)
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, cwd=None: calls.append(cmd) or 0)
    assert cli.main(["open", *args]) == 0
    (cmd,) = calls
    return cmd


def test_open_as_root_allows_root(monkeypatch):
    # Jupyter exits with "Running as root is not recommended. Use --allow-root to bypass."
    cmd = _open_command(monkeypatch, 0)
    assert cmd[:4] == [sys.executable, "-m", "jupyterlab", "--allow-root"]
    assert cmd.count("--allow-root") == 1 and cmd[-1] == "index.ipynb"
    assert "--allow-root" not in _open_command(monkeypatch, 1000)        # a user needs none
    assert _open_command(monkeypatch, 0, "--", "--allow-root").count("--allow-root") == 1


@pytest.mark.service            # a server on a port: the browser tests' xdist group (conftest)
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="checks the root case; the command is checked by the test above")
def test_open_as_root_starts_a_server_that_answers(monkeypatch, tmp_path):
    """As root, the command `mlsys-lab open` runs really starts JupyterLab, which answers."""
    import secrets
    import signal
    import time
    import urllib.request

    from mlsys_lab.reader.browser import free_port

    port, token, answered = free_port(), secrets.token_hex(8), []
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}

    def run(cmd, cwd=None):
        log = open(tmp_path / "lab.log", "wb")
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    url = f"http://127.0.0.1:{port}/api/status?token={token}"
                    with urllib.request.urlopen(url, timeout=2) as reply:
                        answered.append(reply.status)
                        break
                except OSError:
                    time.sleep(0.5)
            return proc.poll() or 0
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=15)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.close()

    monkeypatch.setattr(cli.subprocess, "call", run)
    assert cli.main(["open", "--", "--no-browser", "--ServerApp.ip=127.0.0.1",
                     f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                     f"--IdentityProvider.token={token}"]) == 0
    assert answered == [200], (tmp_path / "lab.log").read_text(errors="replace")[-3000:]


def test_doctor_reports_everything_with_fixes(capsys):
    found = doctor.checks()
    names = [c.name for c in found]
    assert names == ["Python", "numpy", "numba", "JupyterLab", "ipywidgets", "matplotlib",
                     "Graphviz dot", "CUDA", "MPI", "browser", "Chinese font"]
    import numba
    import numpy

    by = {c.name: c for c in found}
    assert by["Python"].ok and by["Python"].found.startswith(sys.version.split()[0])
    assert by["numpy"].found == numpy.__version__ and by["numba"].found == numba.__version__
    assert all(c.fix for c in found if not c.ok)
    assert cli.main(["doctor"]) == (1 if any(c.required and not c.ok for c in found) else 0)
    out = capsys.readouterr().out
    assert all(name in out for name in names)


def test_doctor_names_the_fix_for_what_is_missing(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name, path=None: None)
    monkeypatch.setattr(doctor, "_module", lambda name, dist=None:
                        None if name in ("numpy", "mpi4py") else "1.0")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    found = {c.name: c for c in doctor.checks()}
    dot = found["Graphviz dot"]
    assert not dot.ok and "apt-get install -y graphviz" in dot.fix
    assert "conda install -c conda-forge graphviz" in dot.fix
    assert not found["numpy"].ok and found["numpy"].required and "pip install" in found["numpy"].fix
    assert not found["MPI"].ok and "mpi4py" in found["MPI"].fix
    assert not found["browser"].ok and "chromium-driver" in found["browser"].fix
    text = doctor.report(list(found.values()))
    assert "MISSING" in text and "missing for the chapters: numpy" in text
    assert doctor.run_doctor() == 1


def test_doctor_finds_a_chinese_font_or_names_the_package(monkeypatch):
    # Chromium on a fresh Debian has no CJK font: every chapter's Chinese name is empty boxes.
    listed = {"out": ""}
    monkeypatch.setattr(doctor.sys, "platform", "linux")
    monkeypatch.setattr(doctor.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")

    def run(cmd, **kwargs):
        assert cmd == ["/usr/bin/fc-list", ":lang=zh", "family"]
        return subprocess.CompletedProcess(cmd, 0, listed["out"], "")

    monkeypatch.setattr(doctor.subprocess, "run", run)
    none = doctor._cjk_font()
    assert not none.ok and not none.required and "fonts-noto-cjk" in none.fix
    assert "apt-get install -y fonts-noto-cjk" in none.fix and "empty boxes" in none.found
    text = doctor.report([none])
    assert "absent (optional)  Chinese font" in text and "fonts-noto-cjk" in text
    listed["out"] = "Noto Sans CJK JP,Noto Sans CJK JP Regular\nNoto Sans CJK SC\n"
    found = doctor._cjk_font()
    assert found.ok and found.found == "Noto Sans CJK SC and 1 more"
    monkeypatch.setattr(doctor.shutil, "which", lambda name, path=None: None)   # no fontconfig
    assert not doctor._cjk_font().ok and "fonts-noto-cjk" in doctor._cjk_font().fix


def test_doctor_cuda_is_optional_the_chapters_use_the_simulator(monkeypatch):
    import numba.cuda

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(numba.cuda, "is_available", lambda: False)
    cuda = doctor._cuda()
    assert not cuda.ok and not cuda.required and cuda.note.startswith("optional")
    assert "simulator by itself" in cuda.fix and "export" not in cuda.fix   # no step to take
    assert "absent (optional)" in doctor.report([cuda])
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert doctor._cuda().ok and "simulator" in doctor._cuda().note


# ----------------------------------------------------------------------------- the start page
def test_start_page_is_committed_up_to_date_and_links_everything():
    committed = (ROOT / "index.ipynb").read_text(encoding="utf-8")
    assert committed == normal_text(start_page.start_page(ROOT)), \
        "index.ipynb is stale: python -m mlsys_lab.reader.start_page"
    text = "".join("".join(c["source"]) for c in json.loads(committed)["cells"])
    links = re.findall(r"\]\(([^)]+\.ipynb)\)", text)
    assert links and all((ROOT / link).is_file() for link in links)
    for c in chapters(ROOT):
        assert c.notebook in links and c.english in text and c.chinese in text
        assert (c.exercises is None or c.exercises in links)
    assert "5 is the opening page of the advanced part" in text
    assert "18 and 19 come after the book's last chapter (17)" in text


def test_catalogue_reads_names_from_the_notebooks(tmp_path):
    (tmp_path / "chapters").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Chapter 12 · Part · 拓展篇\n\ntext")]
    nbformat.write(nb, str(tmp_path / "chapters" / "12_part.ipynb"))
    (c,) = chapters(tmp_path)
    assert (c.number, c.english, c.chinese, c.exercises) == (12, "Part", "拓展篇", None)
    nb.cells = [nbformat.v4.new_markdown_cell("no heading")]
    nbformat.write(nb, str(tmp_path / "chapters" / "13_bad.ipynb"))
    with pytest.raises(ValueError, match="13_bad.ipynb"):
        chapters(tmp_path)


# ----------------------------------------------------------------------------- the export
def test_offline_notebook_keeps_pictures_and_revives_explorers():
    from mlsys_lab.viz.explorer_view import MIMETYPE

    nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={
            export.WIDGET_VIEW: {"model_id": "1"}, "image/png": "iVBOR", "text/plain": "w"}),
        nbformat.v4.new_output("display_data", data={
            export.WIDGET_VIEW: {"model_id": "2"}, "image/png": "iVBOR", "text/plain": "e",
            MIMETYPE: {"model": {"title": "</script>t"}, "step": 0}}),
    ]
    nb.cells = [cell]
    out = export.offline_notebook(nb)
    first, second = out.cells[0].outputs
    assert export.WIDGET_VIEW not in first.data and "image/png" in first.data
    assert "mlsys-explorer-offline" in second.data["text/html"]
    assert "</script>t" not in second.data["text/html"]           # cannot close its script tag
    assert "widgets" not in out.metadata and "widgets" in nb.metadata   # the input is untouched
    page = export.export_notebook(nb, "demo")
    assert "window.__mlsysExplorer" in page and "export default" not in page
    assert not re.findall(r'<(?:script|link)[^>]+(?:src|href)="https?:', page)


def test_export_prints_each_chapter_as_it_goes_and_lists_the_pages(tmp_path, monkeypatch, capsys):
    # It used to print nothing for a minute, then only "wrote site/index.html".
    (tmp_path / "chapters").mkdir()
    for number, english, chinese in ((2, "Intro", "导论"), (3, "Interface", "编程接口")):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(f"# Chapter {number} · {english} · {chinese}")]
        nbformat.write(nb, str(tmp_path / "chapters" / f"0{number}_{english.lower()}.ipynb"))
    printed_before = []

    def render(nb, title):              # what had been printed when each page started
        printed_before.append(capsys.readouterr().out)
        return f"<html>{title}</html>"

    monkeypatch.setattr(export, "export_notebook", render)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "--out", "site"]) == 0
    rest = capsys.readouterr().out
    assert printed_before[0].startswith("exporting 2 chapters")
    assert "[1/2] chapters/02_intro.ipynb -> site/02_intro.html" in printed_before[1]
    assert "[2/2] chapters/03_interface.ipynb -> site/03_interface.html" in rest
    assert "wrote 3 pages (2 chapters and the start page):" in rest
    listed = [line.strip() for line in rest.splitlines() if line.startswith("  ")]
    assert listed == ["site/02_intro.html", "site/03_interface.html", "site/index.html"]
    assert all((tmp_path / page).is_file() for page in listed)
    assert "编程接口" in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- import cost
def _fresh_python(code: str, *args: str, argv0: str | None = None) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet); returns its stdout."""
    cmd = [sys.executable, "-c", code] if argv0 is None else [sys.executable, argv0, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_import_does_not_import_ml_dtypes_until_a_storage_dtype_is_used():
    # ml_dtypes' extension was 1 s of the 2 s `import mlsys_lab`; only storage dtypes need it.
    out = _fresh_python("""
import sys
import numpy as np
import mlsys_lab as ml
from mlsys_lab.engine import dtypes
before = "ml_dtypes" in sys.modules
(ml.tensor([1.0, 2.0], requires_grad=True) * 2).sum().backward()
assert dtypes.promote("int8", "uint8") == np.int16 and dtypes.as_dtype("f32") == np.float32
after_compute = "ml_dtypes" in sys.modules
import ml_dtypes
assert ml.bfloat16 == np.dtype(ml_dtypes.bfloat16)
from mlsys_lab.engine.dtypes import STORAGE, SUPPORTED, float8_e4m3fn, uint2
assert len(STORAGE) == 11 and set(STORAGE) <= set(SUPPORTED) and uint2 in STORAGE
assert float8_e4m3fn == np.dtype(ml_dtypes.float8_e4m3fn) and "bfloat16" in dir(dtypes)
print(before, after_compute)
""")
    assert out.split() == ["False", "False"]


HEAVY = ("ml_dtypes",)
CONSOLE_SCRIPT = f"""
import atexit, sys
atexit.register(lambda: print("heavy:", *[m for m in {HEAVY!r} if m in sys.modules]))
from mlsys_lab.cli import main
sys.exit(main())
"""


def test_version_imports_no_storage_dtypes(tmp_path):
    # `mlsys-lab --version` took 5 s; 1 s of every import was ml_dtypes' extension, which only
    # the storage dtypes need: it is now imported on first use.
    script = tmp_path / "mlsys-lab"               # the name pip gives the console script
    script.write_text(CONSOLE_SCRIPT)
    out = _fresh_python("", "--version", argv0=str(script)).splitlines()
    assert out[0] == f"mlsys-lab {mlsys_lab.__version__}"
    assert "ml_dtypes" not in out[-1], out


FOREIGN_FIRST = {
    # The first storage dtype the library meets is an array made by the user's own ml_dtypes.
    "guard": "get('sin').infer(AVal((3,), bf))",
    "promote": "dtypes.promote(np.float32, bf)",
    "tensor": "ml.ops.exp(ml.tensor(np.ones(3, bf)))",
    "is_storage": "assert dtypes.is_storage_float(bf); raise ml.DTypeError('storage dtype')",
}


@pytest.mark.parametrize("hooked", [True, False], ids=["import-hook", "safety-net"])
@pytest.mark.parametrize("first", FOREIGN_FIRST)
def test_a_storage_dtype_made_outside_the_library_is_still_refused(first, hooked):
    # ml_dtypes imported by the user after mlsys_lab makes the storage dtypes at once (an entry
    # of sys.meta_path), so the ops' hot check stays one set lookup; with that entry bypassed
    # (another import hook first) the checks off the hot path still find them.
    if first == "guard" and not hooked:
        pytest.skip("the hot path relies on the import hook")
    out = _fresh_python(f"""
import sys
import numpy as np
import mlsys_lab as ml
from mlsys_lab.engine import dtypes
from mlsys_lab.engine.registry import AVal, get
if not {hooked}:
    dtypes._OnMlDtypesImport.remove()
assert dtypes._UNLOADED and (dtypes._OnMlDtypesImport in sys.meta_path) is {hooked}
import ml_dtypes
bf = np.dtype(ml_dtypes.bfloat16)
assert dtypes._UNLOADED is not {hooked} and dtypes._OnMlDtypesImport not in sys.meta_path
try:
    {FOREIGN_FIRST[first]}
except ml.DTypeError as error:
    print("refused:", error)
assert ml.tensor(np.ones(2, bf)).dtype == bf and dtypes.as_dtype("bf16") == bf
""")
    assert out.startswith("refused:") and "storage dtype" in out, out
