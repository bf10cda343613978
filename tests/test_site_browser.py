"""The lab as a website: the site `make site` built (in site/_build/html/), walked in headless Chromium.

The built folder is served by `python -m http.server` on a free loopback port, as the README says to
serve it. The test opens the landing page, follows its links to the notebook pages and requires one
page per notebook in notebooks/; on the landing page and every notebook page, every image has loaded,
no output shows an error or a traceback, no widget placeholder is left (the site drops the widget
views, site/dsv4site.py), and each notebook page names its source, which downloads. Every same-site
link on those pages answers. The browser reaches nothing but the local server (MathJax ships with the
site), and the math of notebook 03 is typeset. Screenshots of the landing page and one notebook page go to
test-artifacts/browser/site/.

`make test` builds the site first (`make site`); run alone, build it with `make site`.
"""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import lab_server  # noqa: E402  (free_port)

SITE = REPO / "site" / "_build" / "html"
LANDING = "site/index.html"
SHOT_NOTEBOOK = "02_head_batched_mma"  # the notebook page whose screenshot goes with the landing page's
SERVER_START_S = 30

pytestmark = pytest.mark.browser

# What a page shows that it must not: error outputs, tracebacks, widget placeholders, docutils errors.
_PAGE_JS = """() => {
  const imgs = [...document.querySelectorAll('img')];
  const main = document.querySelector('main') || document.body;
  const text = main.innerText;
  const bad = [];
  for (const sel of ['.cell_output .traceback', '.cell_output .stderr', '.system-message', '.problematic',
                     '.jupyter-widgets', '.widget-area', 'script[type^="application/vnd.jupyter.widget"]'])
    if (document.querySelector(sel)) bad.push('an element ' + sel);
  for (const s of ['Traceback (most recent call last)', 'Error displaying widget', 'Loading widget',
                   'application/vnd.jupyter.widget', 'model_id', 'widget not found', 'Model not found',
                   'interactive(children='])
    if (text.includes(s)) bad.push('the text ' + JSON.stringify(s));
  return {bad, title: document.title,
          imgs: imgs.map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
          links: [...document.querySelectorAll('a[href]')].map(a => a.href),
          source: [...document.querySelectorAll('.dsv4lab-run a.download')].map(a => a.href)};
}"""


@pytest.fixture(scope="session")
def site():
    """The built site served over HTTP on a free loopback port; yields its base URL."""
    if not (SITE / LANDING).exists():
        pytest.fail(f"no built site at {SITE / LANDING}: build it with `make site`", pytrace=False)
    port = lab_server.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(SITE)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"python -m http.server did not serve {SITE} on port {port}", pytrace=False)
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _notebooks() -> set[str]:
    return {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}


def _page(url: str) -> str:
    return urldefrag(url)[0]


def test_site_walk(site, browser, artifacts):
    shots = artifacts / "site"
    shots.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    external: list[str] = []

    def offline(route):  # the site must work from the local server alone
        if urlparse(route.request.url).netloc == urlparse(site).netloc:
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    context.route("**/*", offline)
    page = context.new_page()
    problems: list[str] = []
    try:
        resp = page.goto(site)  # the root's index.html sends the reader to the landing page
        page.wait_for_url(site + LANDING)
        assert resp is not None and resp.ok
        landing = page.evaluate(_PAGE_JS)
        page.screenshot(path=str(shots / "landing.png"), full_page=True)

        # the landing page's links: one page per notebook, and the README's and docs' pages
        pages = {_page(u) for u in landing["links"] if u.startswith(site) and urlparse(u).path.endswith(".html")}
        reached = {Path(urlparse(u).path).stem: u for u in pages if urlparse(u).path.startswith("/notebooks/")}
        assert set(reached) == _notebooks(), (
            f"the landing page links to notebook pages {sorted(reached)}; notebooks/ holds {sorted(_notebooks())}")
        assert any(urlparse(u).path == "/README.html" for u in pages), "the landing page does not link to the README"

        seen = {site + LANDING: landing}
        for url in sorted(pages - set(seen)):
            resp = page.goto(url)
            if resp is None or not resp.ok:
                problems.append(f"{url}: HTTP {resp.status if resp else 'no response'}")
                continue
            seen[url] = info = page.evaluate(_PAGE_JS)
            stem = Path(urlparse(url).path).stem
            if stem in reached and (not info["source"] or any(not s.endswith(f"/{stem}.ipynb") for s in info["source"])):
                problems.append(f"{stem}: no link to its source {stem}.ipynb under the title ({info['source']})")
            if stem.startswith("03_") and not page.locator("mjx-container").count():
                problems.append(f"{stem}: no math typeset (MathJax did not run)")
            if stem == SHOT_NOTEBOOK:
                page.screenshot(path=str(shots / f"{stem}.png"))
                for label, sel in (("plot", "main img"), ("kernel", "main .kernel-source")):
                    page.locator(sel).first.scroll_into_view_if_needed()
                    page.screenshot(path=str(shots / f"{stem}-{label}.png"))

        for url, info in seen.items():
            problems += [f"{url}: {b}" for b in info["bad"]]
            problems += [f"{url}: image {i['src']} did not load" for i in info["imgs"] if not i["ok"]]
        assert sum(len(i["imgs"]) for i in seen.values()) > 0, "no page shows an image"

        # every same-site link of these pages (and each notebook's source download) answers
        links = {_page(u) for info in seen.values() for u in info["links"] + info["source"] if u.startswith(site)}
        for url in sorted(links - set(seen)):
            r = context.request.get(url)
            if not r.ok:
                problems.append(f"broken link {url}: HTTP {r.status}")
    finally:
        context.close()
    problems += [f"a request left the local server: {u}" for u in sorted(set(external))]
    assert not problems, "\n".join(problems)
    print(f"site walk: {len(seen)} pages, {len(links)} links")
