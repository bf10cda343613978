"""The site's hooks (a Sphinx extension loaded by site/conf.py). Each changes what Sphinx reads or
writes in memory; no notebook or page in the repository is edited.

- Notebooks (source-read): each widget view is dropped from its cell's outputs, with the saved widget
  state, because a static page cannot run the kernel behind it; the static figure or table the
  notebook puts after every widget (tests/test_notebook_static.py) is what the page shows. A box under
  the title names the notebook's file and the commands that run it. A main notebook NN gets a hidden
  toctree of its appendices NNa, NNb, ..., so they sit under it in the navigation.
- Notebooks (doctree-read): kernel sources printed by a cell (a stream output with a @triton.jit or
  @gluon.jit function, or a diff of one) are highlighted as Python (or as a diff).
- Pages (doctree-read): a Markdown link to a folder of the repository or to a Markdown file that is not
  a page of the site becomes its repository path in the text (a link to any other file of the
  repository is already a download, MyST's own rule).
- The landing page (source-read): its notebook list, stage table and recorded devices are written
  from notebooks/ and data/runs/ at build time.
- The build's root gets an index.html that sends the reader to the landing page.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from pygments.lexers import DiffLexer, PythonLexer
from pygments.token import Error

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LANDING = "site/index"
NAME = re.compile(r"^(\d\d)([a-z]?)_[a-z0-9_]+$")
KERNEL_START = re.compile(r"^(@triton\.(jit|autotune)|@gluon\.jit)\b", re.M)
DIFF_START = re.compile(r"^--- .*\n\+\+\+ ", re.M)
NBVAL = ".venv/bin/python -m pytest -q --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg"


# --- notebooks -------------------------------------------------------------------------------------

def _cell_text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _md_cell(text: str, cell_id: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": text}


def _header(stem: str, widgets: int) -> str:
    live = ("" if not widgets else " Its widget runs live in JupyterLab only; the page shows the static figure or "
            "table that follows it." if widgets == 1 else f" Its {widgets} widgets run live in JupyterLab only; the "
            "page shows the static figure or table that follows each.")
    return (f":::{{admonition}} Notebook `notebooks/{stem}.ipynb`\n:class: dsv4lab-run\n\n"
            f"The outputs are the committed notebook's own, from a real run, shown as saved.{live}\n\n"
            f"- source: {{download}}`{stem}.ipynb`\n"
            f"- in JupyterLab: `make lab`, then open `{stem}.ipynb`\n"
            f"- headless: `{NBVAL} notebooks/{stem}.ipynb`\n:::\n")


def _appendices(srcdir: Path, stem: str) -> list[str]:
    m = NAME.match(stem)
    if not m or m.group(2):
        return []
    return sorted(p.stem for p in (srcdir / "notebooks").glob(f"{m.group(1)}[a-z]_*.ipynb"))


#: a link into a notebook's section: JupyterLab names a heading's anchor by its text ("#Timeline"), MyST
#: by its slug ("#timeline"); the notebooks keep JupyterLab's, the page gets MyST's
SECTION_LINK = re.compile(r"(\.ipynb|\]\()#([A-Za-z0-9_-]+)")           # another notebook's, or this one's


def _site_anchors(text: str) -> str:
    return SECTION_LINK.sub(lambda m: f"{m.group(1)}#{m.group(2).lower()}", text)


def notebook_for_the_page(nb: dict, stem: str, appendices: list[str]) -> dict:
    """The notebook as the page shows it: widget views and their saved state dropped, links into other
    notebooks' sections pointed at the page's anchors, the header box under the title, a hidden
    toctree of its appendices at the end."""
    nb.get("metadata", {}).pop("widgets", None)
    widgets = 0
    for cell in nb["cells"]:
        if cell.get("cell_type") == "markdown":
            cell["source"] = _site_anchors(_cell_text(cell))
        if cell.get("cell_type") == "code":
            outputs = cell.get("outputs", [])
            cell["outputs"] = [o for o in outputs if WIDGET_VIEW not in o.get("data", {})]
            widgets += len(outputs) - len(cell["outputs"])
            for o in cell["outputs"]:
                md = o.get("data", {}).get("text/markdown")
                if md is not None:
                    o["data"]["text/markdown"] = _site_anchors("".join(md) if isinstance(md, list) else md)
    first = nb["cells"][0]
    text = _cell_text(first)
    if first.get("cell_type") == "markdown" and text.startswith("# "):
        title, _, rest = text.partition("\n")
        first["source"] = f"{title}\n\n{_header(stem, widgets)}\n{rest}"
    else:
        nb["cells"].insert(0, _md_cell(_header(stem, widgets), "dsv4site-header"))
    if appendices:
        nb["cells"].append(_md_cell("```{toctree}\n:hidden:\n\n" + "\n".join(appendices) + "\n```\n", "dsv4site-appendices"))
    return nb


# --- the landing page ------------------------------------------------------------------------------

def _title(path: Path) -> str:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        for line in _cell_text(cell).splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return path.stem


def notebook_list(srcdir: Path) -> str:
    """The notebooks in the lab's order, each appendix under its notebook, as links."""
    lines = []
    for p in sorted((srcdir / "notebooks").glob("*.ipynb")):
        m = NAME.match(p.stem)
        indent = "  " if m and m.group(2) else ""
        lines.append(f"{indent}- [{_title(p)}](../notebooks/{p.name})")
    return "\n".join(lines)


def _replays(srcdir: Path) -> list[tuple[Path, dict]]:
    runs = [(p.parent, json.loads(p.read_text())) for p in sorted((srcdir / "data" / "runs").glob("*/reproduce/reproduce.json"))]
    return sorted(runs, key=lambda r: r[1]["environment"]["date"], reverse=True)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def stage_table(srcdir: Path) -> str:
    """The stages of the newest recorded replay: name, what it is, tok/s at the lowest and highest C."""
    folder, run = _replays(srcdir)[0]
    cs = [min(run["concurrency"]), max(run["concurrency"])]
    tok = {(r["stage"], r["C"]): r["tok_s"] for r in run["tables"]["throughput"] if r.get("finite")}
    rows = ["| stage | what it is | " + " | ".join(f"tok/s at C = {c}" for c in cs) + " |", "|---|---|---|---|"]
    for s in run["stages_run"]:
        cells = [f"**{s['name']}**", s["title"].replace("|", "\\|")] + [_fmt(tok.get((s["name"], c))) for c in cs]
        rows.append("| " + " | ".join(cells) + " |")
    note = (f"Recorded in `{folder.relative_to(srcdir)}/` on one {run['environment']['device']['name']}, "
            f"{run['environment']['date'][:10]} (tok/s: C requests, one token each per decode step of one GPU's share).")
    return "\n".join(rows) + "\n\n" + note


def _device(d: dict) -> str:
    return (f"{d['name']} ({d['sm_count']} SMs, sm_{d['capability'].replace('.', '')}, {d['memory_gb']:.0f} GB), "
            f"torch {d['torch']}, triton {d['triton']}")


def device_list(srcdir: Path) -> str:
    """One line per recorded run folder under data/runs/: what it holds, the device, the dates."""
    lines = []
    for folder in sorted(p for p in (srcdir / "data" / "runs").iterdir() if p.is_dir()):
        rel = folder.relative_to(srcdir)
        dev_file, manifest = folder / "device.json", folder / "manifest.json"
        if dev_file.exists():
            dates = [v["date"][:10] for v in json.loads(manifest.read_text()).values()] if manifest.exists() else []
            when = f", {min(dates)} to {max(dates)}" if dates else ""
            parts = ", ".join(sorted(p.stem for p in folder.glob("*.json") if p.name != "manifest.json"))
            lines.append(f"- `{rel}/`: the kernel runs (`python -m dsv4lab record`: {parts}) on one "
                         f"{_device(json.loads(dev_file.read_text())['device'])}{when}.")
        rep = folder / "reproduce" / "reproduce.json"
        if rep.exists():
            run = json.loads(rep.read_text())
            env = run["environment"]
            stages = " ".join(s["name"] for s in run["stages_run"])
            lines.append(f"- `{rel}/reproduce/`: the campaign replay (`python -m dsv4lab reproduce`, stages "
                         f"{stages}) on one {_device(env['device'])}, {env['date'][:10]}.")
    return "\n".join(lines)


LANDING_PARTS = {"notebooks": notebook_list, "stages": stage_table, "devices": device_list}
MARKER = re.compile(r"^<!-- dsv4site:(\w+) -->$", re.M)


def landing_page(text: str, srcdir: Path) -> str:
    return MARKER.sub(lambda m: LANDING_PARTS[m.group(1)](srcdir), text)


# --- Sphinx hooks ----------------------------------------------------------------------------------

def _source_read(app, docname: str, source: list[str]) -> None:
    srcdir = Path(app.srcdir)
    if docname == LANDING:
        source[0] = landing_page(source[0], srcdir)
    elif docname.startswith("notebooks/"):
        stem = docname.split("/", 1)[1]
        nb = notebook_for_the_page(json.loads(source[0]), stem, _appendices(srcdir, stem))
        source[0] = json.dumps(nb)


def _clean(code: str, lexer) -> bool:
    return not any(tok is Error for tok, _ in lexer.get_tokens(code))


def _highlight_kernels(app, doctree) -> None:
    """A printed kernel source (a stream output) is shown highlighted: the text before it stays plain."""
    for block in list(doctree.findall(nodes.literal_block)):
        if "stream" not in block["classes"]:
            continue
        text = block.astext()
        diff, kernel = DIFF_START.search(text), KERNEL_START.search(text)
        m, language, lexer = (diff, "diff", DiffLexer()) if diff else (kernel, "python", PythonLexer())
        if not m or not _clean(text[m.start():], lexer):
            continue
        code = nodes.literal_block(text[m.start():], text[m.start():], language=language,
                                   classes=["output", "kernel-source"])
        prose = text[:m.start()].rstrip("\n")
        if prose:
            block.replace_self([nodes.literal_block(prose, prose, **{k: block[k] for k in ("classes", "language")
                                                                     if k in block.attributes}), code])
        else:
            block.replace_self(code)


def _repository_links(app, doctree) -> None:
    """Links to what the site does not hold, but the repository does, name the repository path."""
    env = app.env
    srcdir = Path(app.srcdir).resolve()
    for ref in list(doctree.findall(addnodes.pending_xref)):
        if ref.get("reftype") != "myst":
            continue
        if ref.get("refdomain") == "doc":
            if ref["reftarget"] in env.found_docs:
                continue
            paths = [srcdir / (ref["reftarget"] + suffix) for suffix in app.config.source_suffix]
            path = next((p for p in paths if p.exists()), paths[0])
        else:
            path = Path(env.relfn2path(ref["reftarget"].split("#")[0], env.docname)[1])
        if not path.exists() or srcdir not in path.resolve().parents:
            continue  # left to MyST: a broken link stays a build error
        rel = path.resolve().relative_to(srcdir).as_posix() + ("/" if path.is_dir() else "")
        text = ref.astext()
        shown = [nodes.literal(rel, rel)] if text.strip("`/ ") == rel.strip("/") else \
            [*ref.deepcopy().children, nodes.Text(" ("), nodes.literal(rel, rel), nodes.Text(" in the repository)")]
        ref.replace_self(nodes.inline("", "", *shown, classes=["repository-path"]))


ROOT_REDIRECT = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dsv4lab</title>
<meta http-equiv="refresh" content="0; url={0}"></head>
<body><p><a href="{0}">dsv4lab: the lab as a website</a></p></body></html>
"""


def _root_redirect(app, exception) -> None:
    if exception is None and app.builder.format == "html" and LANDING != "index":
        (Path(app.outdir) / "index.html").write_text(ROOT_REDIRECT.format(f"{LANDING}.html"))


def setup(app):
    app.connect("source-read", _source_read)
    app.connect("doctree-read", _highlight_kernels)
    app.connect("doctree-read", _repository_links)
    app.connect("build-finished", _root_redirect)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
