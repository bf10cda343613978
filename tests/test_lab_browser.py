"""The lab as a reader meets it: JupyterLab in headless Chromium.

One JupyterLab server (tools/lab_server.py, as ``make lab`` starts it) serves a copy of notebooks/
on a free loopback port with a fresh token. For each notebook in NOTEBOOKS the test opens it,
clears its outputs, runs all cells, saves it and checks what the page shows against the saved file:
no error output, every code cell ran, every image output rendered as a loaded <img>, every widget
output rendered as an ipywidgets view. Then it turns every slider (by keyboard) and dropdown of each
widget one step and waits for the widget's output to change. Screenshots go to test-artifacts/browser/.

Needs Chromium (Debian: ``apt-get install chromium``; ``make chromium``) and Playwright for Python
(the ``test`` extra); Playwright drives the system's Chromium, it downloads no browser of its own.
Deselect with ``-m "not browser"``.
"""
from __future__ import annotations

import atexit
import fnmatch
import json
import os
import secrets
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import lab_server  # noqa: E402

ARTIFACTS = REPO / "test-artifacts" / "browser"  # the `artifacts` fixture (conftest.py) clears it
# Notebooks to run in the browser (glob on notebooks/) and each one's time budget in seconds: opening,
# running every cell, saving and turning every widget knob. CPU run times here: 00 ~5 s, 02 ~30 s, 03 ~15 s.
NOTEBOOKS = {"00_*.ipynb": 300, "02_*.ipynb": 300, "03_*.ipynb": 300, "06a_*.ipynb": 300, "07_*.ipynb": 300}
SERVER_START_S = 120
OPEN_S = 120  # for a notebook to open with its kernel started
TURN_S = 120  # for a widget's output to change after one knob is turned
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

pytestmark = pytest.mark.browser


def _selected():
    names = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    return [(n, t) for pat, t in NOTEBOOKS.items() for n in names if fnmatch.fnmatch(n, pat)]


def test_notebook_list_is_not_empty():
    assert _selected(), f"none of {list(NOTEBOOKS)} matches a notebook in notebooks/"


class Lab:
    """A running JupyterLab: its port, token, served folder and log."""

    def __init__(self, root: Path, log: Path):
        self.root, self.log = root, log
        self.port, self.token = lab_server.free_port(), secrets.token_hex(24)

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(self.url(path), method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 15) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join("    " + line for line in lines[-n:])


def _settings(folder: Path):
    """JupyterLab user settings for the test server: no news or update checks (no network)."""
    f = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@pytest.fixture(scope="session")
def lab(tmp_path_factory, artifacts):
    """JupyterLab on a copy of notebooks/ (saving never touches the repository), stopped at the end."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    shutil.copytree(REPO / "notebooks", root)
    _settings(tmp / "settings")
    lab = Lab(root, artifacts / "jupyter-server.log")
    # Own config/runtime/data dirs: nothing of the user's Jupyter set-up (or its extensions) leaks in.
    env = {**os.environ, **{f"JUPYTER_{k}_DIR": str(tmp / k.lower()) for k in ("CONFIG", "RUNTIME", "DATA")}}
    # The notebooks' `import dsv4lab` picks the mode, as for a reader (this process's import set TRITON_INTERPRET).
    env.pop("TRITON_INTERPRET", None)
    extra = [f"--LabApp.user_settings_dir={tmp / 'settings'}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(lab.log, "w") as log:
        proc = lab_server.start(root, lab.port, lab.token, *extra, env=env, log=log)
    atexit.register(lab_server.stop, proc)  # also if the session dies before the fixture's teardown
    try:
        try:
            lab_server.wait_ready(proc, lab.port, lab.token, SERVER_START_S)
            error = None
        except RuntimeError as e:
            error = e
        if error:
            pytest.fail(f"JupyterLab did not start: {error}. Server log {lab.log}:\n{lab.log_tail()}", pytrace=False)
        yield lab
    finally:
        lab_server.stop(proc)


# --- reading the page ------------------------------------------------------------------------------

# Snapshot of what a widget shows (text and images of its ipywidgets Output areas), as a short key;
# also whether it shows a traceback and whether every image in it has loaded.
_SNAPSHOT_JS = """view => {
  const outs = [...view.querySelectorAll('.widget-output')];
  const areas = outs.length ? outs : [view];
  let s = '', h = 0;
  const imgs = [];
  for (const a of areas) { s += a.innerText; imgs.push(...a.querySelectorAll('img')); }
  for (const i of imgs) s += i.src;
  for (let k = 0; k < s.length; k++) h = (h * 31 + s.charCodeAt(k)) | 0;
  return {key: s.length + ':' + h, empty: s.trim().length === 0,
          traceback: areas.some(a => a.innerText.includes('Traceback (most recent call last)')),
          text: areas.map(a => a.innerText).join('\\n').slice(-1500),
          imgs_ok: imgs.every(i => i.complete && i.naturalWidth > 0)};
}"""

# A widget output renders as an output area holding an ipywidgets view (it carries no data-mime-type);
# top level: not one shown inside another widget's Output area.
_VIEWS = ".jp-OutputArea-output:has(> .jupyter-widgets):not(.jupyter-widgets .jp-OutputArea-output)"

# A notebook's top-level image and widget outputs, as the page rendered them.
_OUTPUTS_JS = """(panel, views) => {
  const images = [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type^="image/"]')]
    .filter(o => !o.closest('.jupyter-widgets'));
  return {images: images.map(o => { const i = o.querySelector('img');
                                    return i !== null && i.complete && i.naturalWidth > 0; }),
          widgets: [...panel.querySelectorAll(views)].map(o => { const r = o.getBoundingClientRect();
            return r.width > 0 && r.height > 0 && !o.innerText.includes('Error displaying widget'); })};
}"""


class NotebookPage:
    """One notebook open in JupyterLab, with a deadline for everything done to it."""

    def __init__(self, page, lab: Lab, name: str, timeout_s: float):
        self.page, self.lab, self.name, self.stem = page, lab, name, Path(name).stem
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.console_errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text.splitlines()[0][:300]))
        (ARTIFACTS / self.stem).mkdir(exist_ok=True)

    def left_ms(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.fail(f"over its {self.timeout_s:.0f} s budget (NOTEBOOKS in {Path(__file__).name})")
        return left * 1e3

    def shot(self, label: str, locator=None) -> Path:
        path = ARTIFACTS / self.stem / f"{label}.png"
        try:
            (locator or self.page).screenshot(path=str(path), timeout=15000)
        except Exception as e:  # a screenshot must not hide the failure being reported
            path = Path(f"{path} (not taken: {type(e).__name__})")
        return path

    def fail(self, msg: str):
        shot = self.shot("FAILED")
        console = "".join(f"\n    {c}" for c in self.console_errors[-5:])
        pytest.fail(f"{self.name}: {msg}\n  screenshot: {shot}" + (f"\n  browser console errors:{console}"
                                                                     if console else ""), pytrace=False)

    @property
    def panel(self):
        return self.page.locator(".jp-NotebookPanel").filter(has=self.page.locator(".jp-Notebook")).first

    def menu(self, menu: str, command: str):
        self.page.locator("#jp-MainMenu").get_by_role("menuitem", name=menu, exact=True).click()
        self.page.locator(f'.lm-Menu-item[data-command="{command}"]').click()

    def kernel_status(self) -> str:
        """The kernel's status as the notebook's toolbar shows it."""
        return self.panel.locator(".jp-Notebook-ExecutionIndicator").get_attribute("data-status") or ""

    def kernel_state(self) -> str | None:
        """The server's view of this notebook's kernel (None: no session yet)."""
        states = [s["kernel"]["execution_state"] for s in self.lab.api("/api/sessions") if s["path"] == self.name]
        return states[0] if states else None

    def open(self):
        """Open the notebook and return once its kernel has started and the page shows it idle."""
        # A workspace of its own, reset: only this notebook opens, whatever an earlier run left.
        self.page.goto(self.lab.url(f"/lab/workspaces/{self.stem}/tree/{self.name}?reset"))
        deadline = time.monotonic() + min(self.left_ms() / 1e3, OPEN_S)
        while not (self.panel.count() and self.kernel_state() == "idle" and self.kernel_status() == "idle"):
            if time.monotonic() > deadline:
                self.fail(f"the notebook did not open with an idle kernel within {OPEN_S} s "
                          f"(server log {self.lab.log}):\n{self.lab.log_tail()}")
            self.page.wait_for_timeout(250)

    def run_all(self):
        """Clear every output, run all cells, return once the kernel is idle and no cell is queued."""
        self.menu("Edit", "editmenu:clear-all")
        self.menu("Run", "runmenu:run-all")
        quiet_since = None
        while True:
            prompts = self.panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
            status = self.kernel_status()
            if status in ("dead", "autorestarting", "restarting"):
                self.fail(f"the kernel died while running the cells (status {status!r})")
            done = status == "idle" and not any("*" in p for p in prompts) and any(c.isdigit() for p in prompts
                                                                                    for c in p)
            quiet_since = (quiet_since or time.monotonic()) if done else None
            if quiet_since and time.monotonic() - quiet_since > 1.0:
                return
            self.left_ms()
            self.page.wait_for_timeout(250)

    def save(self) -> nbformat.NotebookNode:
        self.menu("File", "docmanager:save")
        try:  # the tab's "modified" mark goes once the file is written
            self.page.wait_for_selector(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty", state="detached",
                                        timeout=min(self.left_ms(), 60_000))
        except Exception:
            self.fail("saving the notebook did not finish")
        return nbformat.read(self.lab.root / self.name, as_version=4)


def _cell_outputs(nb):
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            yield i, out


def _check_saved(nbp: NotebookPage, nb):
    """No error output, no code cell left unrun."""
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, o in _cell_outputs(nb) if o.output_type == "error"]
    if errors:
        nbp.fail("error output in " + "; ".join(errors))
    unrun = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()
             and c.execution_count is None]
    if unrun:
        nbp.fail(f"code cells {unrun} did not run")


def _check_rendered(nbp: NotebookPage, nb):
    """Every image output is a loaded <img>, every widget output an ipywidgets view with a size."""
    want_imgs = sum(any(k.startswith("image/") for k in o.get("data", {})) for _, o in _cell_outputs(nb))
    want_widgets = sum(WIDGET_VIEW in o.get("data", {}) for _, o in _cell_outputs(nb))
    got = nbp.panel.evaluate(_OUTPUTS_JS, _VIEWS)
    if len(got["images"]) != want_imgs or not all(got["images"]):
        nbp.fail(f"the saved notebook has {want_imgs} image outputs; the page shows {len(got['images'])} "
                 f"image outputs, {sum(got['images'])} of them loaded")
    if len(got["widgets"]) != want_widgets or not all(got["widgets"]):
        nbp.fail(f"the saved notebook has {want_widgets} widget outputs; the page rendered "
                 f"{sum(got['widgets'])} ipywidgets views of {len(got['widgets'])} widget outputs "
                 "(is the JupyterLab widgets extension, jupyterlab_widgets, installed? `jupyter labextension list`)")
    return want_widgets


def _controls(view):
    """The enabled sliders and dropdowns of a widget view, as (kind, locator)."""
    sliders = view.locator(".widget-slider .noUi-target:not([disabled]) .noUi-handle")
    selects = view.locator(".widget-dropdown select:not([disabled]), .widget-select select:not([disabled])")
    return [("slider", sliders.nth(k)) for k in range(sliders.count())] + \
           [("select", selects.nth(k)) for k in range(selects.count())]


def _turn(kind, control) -> str:
    """Move a control one step (back one step at the end of its range); say what was done. Sliders by
    keyboard; dropdowns as a pick from the list (a closed <select> ignores arrow keys in headless Chromium)."""
    label = control.locator("xpath=ancestor::*[contains(@class,'widget-inline-hbox')][1]//label").first
    name = label.inner_text() if label.count() else "?"
    if kind == "slider":
        now, top = (float(control.get_attribute(a)) for a in ("aria-valuenow", "aria-valuemax"))
        key = "ArrowRight" if now < top else "ArrowLeft"
        control.focus()
        control.press(key)
        return f"slider {name!r} {key}"
    values = control.evaluate("s => [...s.options].map(o => o.value)")
    i = control.evaluate("s => s.selectedIndex")
    pick = values[i + 1] if i + 1 < len(values) else values[i - 1]
    control.select_option(pick)
    return f"dropdown {name!r} -> {pick}"


def _check_widgets(nbp: NotebookPage, n_views: int):
    """Turn every knob of every widget view; each turn must change the widget's output."""
    views = nbp.panel.locator(_VIEWS)
    for v in range(n_views):
        view = views.nth(v)
        controls = _controls(view)
        if not controls:
            nbp.fail(f"widget {v} has no enabled slider or dropdown to turn")
        nbp.shot(f"widget{v}-before", view)
        for kind, control in controls:
            before = view.evaluate(_SNAPSHOT_JS)
            what = _turn(kind, control)
            turn_deadline = time.monotonic() + TURN_S
            while True:
                now = view.evaluate(_SNAPSHOT_JS)
                if now["traceback"]:
                    nbp.fail(f"widget {v}: after {what} its output shows a traceback:\n{now['text']}")
                if now["key"] != before["key"] and not now["empty"] and now["imgs_ok"] \
                        and nbp.kernel_status() == "idle":
                    break
                if time.monotonic() > turn_deadline:
                    nbp.fail(f"widget {v}: after {what} its output did not change within {TURN_S} s")
                nbp.left_ms()
                nbp.page.wait_for_timeout(250)
        nbp.shot(f"widget{v}-after", view)


def _shutdown_kernels(lab: Lab):
    for s in lab.api("/api/sessions"):
        lab.api(f"/api/sessions/{s['id']}", method="DELETE")


@pytest.mark.parametrize("name,timeout_s", _selected(), ids=[n for n, _ in _selected()])
def test_notebook_runs_and_widgets_respond_in_jupyterlab(lab, browser, name, timeout_s):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        nbp = NotebookPage(context.new_page(), lab, name, timeout_s)
        nbp.open()
        nbp.run_all()
        nb = nbp.save()
        nbp.shot("after-run-all")
        _check_saved(nbp, nb)
        n_views = _check_rendered(nbp, nb)
        _check_widgets(nbp, n_views)
    finally:
        context.close()
        _shutdown_kernels(lab)
