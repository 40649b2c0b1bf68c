"""``mlsys-lab export``: every chapter as a self-contained HTML page, readable offline.

Pages are nbconvert's JupyterLab layout with nothing loaded from the network (no require.js,
MathJax or widget manager from a CDN). Outputs of the package's explorer and timeline widgets
become live views again (their JavaScript, ``mlsys_lab/viz/static/explorer.js`` and
``timeline.js``, is inlined in the page and runs from the data saved in the output; a timeline's
controls that need the kernel, such as the pipeline's ``p`` and ``m``, are disabled there); other
widget outputs show the static picture their bundle carries. TeX in Markdown cells is drawn as
SVG images by matplotlib's mathtext (a formula it cannot draw stays as source). A start page
``index.html`` lists the chapters with the book's names.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat

from ..viz.explorer_view import MIMETYPE, STATIC
from ..viz.math_picture import render_math
from ..viz.timeline_view import MIMETYPE as TIMELINE_MIMETYPE
from .catalogue import PART_PAGES, chapters, project_root

__all__ = ["export_notebook", "export_pages", "export_site", "offline_notebook"]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
TEMPLATES = Path(__file__).with_name("templates")
# The widgets' ES modules, each run in its own scope as window.<global>.
MODULES = (("explorer.js", "__mlsysExplorer"), ("timeline.js", "__mlsysTimeline"))


def _explorer_js() -> str:
    parts = []
    for name, handle in MODULES:
        source = (STATIC / name).read_text(encoding="utf-8")
        if "export default" not in source:
            raise ValueError(f"{name} must end with `export default {{ render }}`")
        parts.append("(function () {\n" + source.replace("export default", f"window.{handle} =")
                     + "\n})();")
    parts.append((STATIC / "offline_boot.js").read_text(encoding="utf-8"))
    return "\n".join(parts)


def _widget_css() -> str:
    return "\n".join((STATIC / name).read_text(encoding="utf-8")
                     for name in ("explorer.css", "timeline.css"))


def _explorer_html(state: dict, kind: str = "explorer") -> str:
    payload = json.dumps(state, ensure_ascii=False).replace("</", "<\\/")
    return (f'<div class="mlsys-{kind}-offline"><script type="application/json">{payload}'
            f"</script><p>(the {kind} needs JavaScript)</p></div>")


def offline_notebook(nb) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose widget outputs render without a kernel or a widget manager and whose
    Markdown formulas are SVG images (:func:`~mlsys_lab.viz.math_picture.render_math`)."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "markdown":      # no MathJax offline: formulas become SVG images
            cell.source = render_math(cell.source)
        for out in cell.get("outputs", []):
            data = out.get("data")
            if not data:
                continue
            if MIMETYPE in data:
                out["data"] = {"text/html": _explorer_html(data[MIMETYPE]),
                               "text/plain": data.get("text/plain", "")}
            elif TIMELINE_MIMETYPE in data:
                state = dict(data[TIMELINE_MIMETYPE], offline=True)
                out["data"] = {"text/html": _explorer_html(state, "timeline"),
                               "text/plain": data.get("text/plain", "")}
            elif WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
    return nb


def export_notebook(nb, title: str) -> str:
    """The offline HTML page for notebook ``nb``."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="mlsys_offline",
                            extra_template_basedirs=[str(TEMPLATES)])
    resources = {"metadata": {"name": title}, "mlsys_js": _explorer_js(),
                 "mlsys_css": _widget_css()}
    body, _ = exporter.from_notebook_node(offline_notebook(nb), resources=resources)
    return body


def _start_page(entries) -> str:
    rows = "\n".join(
        f'<tr><td>{c.number}</td><td><a href="{html.escape(page)}">{html.escape(c.english)}</a>'
        f"</td><td>{html.escape(c.chinese)}</td></tr>" for c, page in entries)
    skipped = "; ".join(f"{n} is {what}" for n, what in sorted(PART_PAGES.items()))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mlsys-lab chapters</title>
<style>body {{ font-family: sans-serif; max-width: 860px; margin: 2em auto; }}
td, th {{ padding: 4px 12px; text-align: left; }}</style></head>
<body><h1>mlsys-lab · chapters</h1>
<p>The companion notebooks of <em>Machine Learning Systems: Design and Implementation</em>
(openMLsys, 《机器学习系统：设计和实现》), as pages that work offline: pictures and the
explorer widgets are in the pages themselves.</p>
<table><tr><th>#</th><th>chapter</th><th>中文</th></tr>
{rows}
</table>
<p>Chapter numbers follow the book's website, where {html.escape(skipped)}: no notebook carries
those numbers.</p></body></html>
"""


def export_pages(out, root: Path | None = None, progress=None) -> list[Path]:
    """Write every chapter's page and ``index.html`` into folder ``out``; returns the pages
    written, the chapters in order and the index last.

    ``progress``, when given, is called with one line of text before the first chapter and after
    each page is written (``mlsys-lab export`` prints them: a chapter takes seconds to render).
    """
    import time

    root = project_root(root)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = chapters(root)
    say = progress or (lambda line: None)
    say(f"exporting {len(todo)} chapters from {root} into {out}/")
    entries, pages = [], []
    for i, chapter in enumerate(todo, 1):
        start = time.perf_counter()
        nb = nbformat.read(root / chapter.notebook, as_version=4)
        page = Path(chapter.notebook).with_suffix(".html").name
        title = f"{chapter.number} · {chapter.english} · {chapter.chinese}"
        (out / page).write_text(export_notebook(nb, title), encoding="utf-8")
        entries.append((chapter, page))
        pages.append(out / page)
        say(f"[{i:>{len(str(len(todo)))}}/{len(todo)}] {chapter.notebook} -> {out / page}  "
            f"({time.perf_counter() - start:.1f} s)")
    index = out / "index.html"
    index.write_text(_start_page(entries), encoding="utf-8")
    pages.append(index)
    return pages


def export_site(out, root: Path | None = None, progress=None) -> Path:
    """Write every chapter's page and ``index.html`` into folder ``out``; returns the index
    (:func:`export_pages` returns every page; ``progress`` as there)."""
    return export_pages(out, root, progress)[-1]
