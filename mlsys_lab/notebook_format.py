"""The notebook normal form: what JupyterLab writes when it opens and saves a notebook.

A committed notebook in this form comes back byte-identical when a reader opens it in JupyterLab
and saves it, so their checkout shows no notebook they did not edit as modified. What Lab 4
rewrites (found by opening and saving the committed notebooks in Lab, driven by Chromium, see
``tests/reader/test_browser.py``), and so what :func:`normalise` does:

* ``metadata.kernelspec`` becomes the running kernel's: display name ``Python 3 (ipykernel)``;
* ``metadata.language_info`` becomes the kernel's (``codemirror_mode``, ``pygments_lexer``, ...,
  and ``version``, the kernel's Python: :data:`PYTHON_VERSION` is this project's — a reader on
  another Python sees that one line change, which no committed form can avoid);
* ``nbformat_minor`` is 5 and every cell has an ``id``;
* consecutive stream outputs of the same stream are merged into one, and carriage returns and
  backspaces (progress bars) are resolved to the text they leave on screen;
* every number that is a whole float (``36.0``) becomes an integer (``36``): the notebook passes
  through JavaScript, which has one number type and writes ``36``;
* the file is JSON with one-space indent, sorted keys, non-ASCII kept, multi-line strings split
  into lists of lines, and a trailing newline (``nbformat.writes``).

It also drops the per-cell ``metadata.execution`` timestamps that nbclient records (Lab keeps
them, but they change on every run and mean nothing to a reader).

Command line (the lead's one command to normalise everything)::

    python -m mlsys_lab.notebook_format                 # rewrite every committed notebook
    python -m mlsys_lab.notebook_format --check         # exit 1 listing those not in normal form
    python -m mlsys_lab.notebook_format chapters/04_computational_graph.ipynb
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import re
import sys
from pathlib import Path

import nbformat

__all__ = ["KERNELSPEC", "LANGUAGE_INFO", "PYTHON_VERSION", "committed_notebooks", "is_normal",
           "main", "normal_text", "normalise", "normalise_file", "resolve_overwrites"]

PYTHON_VERSION = "3.11.7"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
    "version": PYTHON_VERSION,
}
FOLDERS = ("chapters", "solutions", "exercises")


def _process_text(index: int, text: str, current: str = "") -> tuple[str, int]:
    """JupyterLab's stream-text processing (``OutputAreaModel``'s ``processText``): write
    ``text`` into ``current`` at cursor ``index``; ``\r`` moves the cursor to the start of its
    line, ``\b`` deletes back (as Lab does), ``\n`` ends the text with a newline. Returns the
    new text and cursor."""
    if not any(ch in text for ch in "\b\r\n"):
        return current[:index] + text + current[index + len(text):], index + len(text)
    n, r, o = current, index, 0
    while True:
        match = _CONTROL.search(text, o)
        s = match.start() if match else -1
        segment = text[o:] if s == -1 else text[o:s]
        n = n[:r] + segment + n[r + len(segment):]
        r += len(segment)
        if s == -1:
            break
        o = s + 1
        ch = text[s]
        if ch == "\b":
            if r > 0 and n[r - 1] != "\n":
                n = n[:r - 1] + n[r + 1:]
                r -= 1
        elif ch == "\r":
            while not (r == 0 or n[r - 1] == "\n"):
                r -= 1
        else:
            n += "\n"
            r = len(n)
    return n, r


_CONTROL = re.compile(r"[\n\b\r]")


def resolve_overwrites(text: str) -> str:
    r"""The text JupyterLab keeps of a stream: carriage returns and backspaces (progress bars)
    resolved the way its output area resolves them before saving."""
    return _process_text(0, text)[0]


def _merge_streams(outputs):
    """Consecutive stream outputs of one stream merged and resolved, as Lab's output area does."""
    merged, index = [], 0
    for out in outputs:
        if out.get("output_type") == "stream":
            text = out["text"] if isinstance(out["text"], str) else "".join(out["text"])
            last = merged[-1] if merged else None
            if last is not None and last.get("output_type") == "stream" \
                    and last["name"] == out["name"]:
                last["text"], index = _process_text(index, text, last["text"])
                continue
            out = copy.deepcopy(out)
            out["text"], index = _process_text(0, text)
        merged.append(out)
    return merged


def _js_numbers(obj):
    """``obj`` with whole floats as ints, as a JSON round trip through JavaScript leaves them
    (below 1e21, where JavaScript starts writing exponents)."""
    if isinstance(obj, float):
        return int(obj) if obj.is_integer() and abs(obj) < 1e21 else obj
    if isinstance(obj, dict):
        return {k: _js_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_js_numbers(v) for v in obj]
    return obj


def _cell_id(index: int, cell) -> str:
    digest = hashlib.sha1(f"{index}:{cell.get('cell_type')}:{cell.get('source')}".encode())
    return digest.hexdigest()[:8]


def normalise(nb) -> nbformat.NotebookNode:
    """A normalised copy of ``nb`` (a NotebookNode or plain dict of nbformat 4)."""
    nb = nbformat.from_dict(_js_numbers(copy.deepcopy(dict(nb))))
    if nb.get("nbformat") != 4:
        nb = nbformat.convert(nb, 4)
    nb["nbformat_minor"] = 5
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = copy.deepcopy(LANGUAGE_INFO)
    seen = set()
    for i, cell in enumerate(nb.cells):
        if not cell.get("id") or cell["id"] in seen:
            cell["id"] = _cell_id(i, cell)
        seen.add(cell["id"])
        cell.metadata.pop("execution", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = _merge_streams(cell.get("outputs", []))
    return nb


def normal_text(nb) -> str:
    """The exact file text of ``nb`` in normal form."""
    text = nbformat.writes(normalise(nb), version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def is_normal(path) -> bool:
    """Whether the notebook file at ``path`` is byte for byte in normal form."""
    text = Path(path).read_text(encoding="utf-8")
    return text == normal_text(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def normalise_file(path) -> bool:
    """Rewrite ``path`` in normal form; returns whether it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    new = normal_text(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def committed_notebooks(root: Path | None = None) -> list[Path]:
    """The notebooks a reader opens: ``chapters/``, ``solutions/``, ``exercises/`` and the start
    page ``index.ipynb`` under ``root`` (the project root by default)."""
    from .reader.catalogue import project_root

    root = project_root(root)
    found = [p for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))]
    if (root / "index.ipynb").is_file():
        found.append(root / "index.ipynb")
    return found


def main(argv=None) -> int:
    """``python -m mlsys_lab.notebook_format [--check] [PATHS...]``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m mlsys_lab.notebook_format",
                                     description="Put notebooks in JupyterLab's normal form.")
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks (default: every committed notebook)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 listing the notebooks not in normal form")
    args = parser.parse_args(argv)
    paths = args.paths or committed_notebooks()
    if args.check:
        bad = [p for p in paths if not is_normal(p)]
        for p in bad:
            print(f"not in normal form: {p}")
        if bad:
            print("fix with: python -m mlsys_lab.notebook_format " + " ".join(map(str, bad)))
        return 1 if bad else 0
    changed = [p for p in paths if normalise_file(p)]
    for p in changed:
        print(f"normalised {p}")
    print(f"{len(changed)} of {len(paths)} notebook(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
