"""Sphinx configuration of the lab's website (`make site`).

The source directory is the repository root (`sphinx-build -c site . site/_build/html`), so the executed
notebooks in notebooks/, docs/*.md and README.md are read where they live, never copied; this folder
holds only this file, the landing page (index.md) and the site's hooks (dsv4site.py). MyST-NB renders
the notebooks' saved outputs as they are (no execution: they are real runs).
"""
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent
sys.path.insert(0, str(SITE))

project = "dsv4lab"

# sphinx-mathjax-offline: MathJax served from the site itself, so math renders without a network
extensions = ["myst_nb", "sphinx-mathjax-offline", "dsv4site"]

root_doc = "site/index"
# Only these are pages; every other entry of the root (the package, data/, .venv, ...) is not even scanned.
include_patterns = ["site/index.md", "README.md", "docs/*.md", "notebooks/*.ipynb"]
exclude_patterns = sorted(p.name for p in SITE.parent.iterdir() if p.name not in {"site", "notebooks", "docs", "README.md"}) \
    + ["site/_build", "**/.ipynb_checkpoints"]

# --- notebooks -------------------------------------------------------------------------------------
nb_execution_mode = "off"          # the committed outputs are the lab's real runs
nb_render_markdown_format = "myst"  # the generated prose: tables, links between notebooks, math
nb_merge_streams = True
nb_ipywidgets_js = {}              # no widget scripts: dsv4site drops the widget views (see there)
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
# The notebooks open with "# NN · title" then "### How to use this notebook": a style warning, not a fault.
suppress_warnings = ["myst.header"]

# --- HTML -----------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "dsv4lab"
html_static_path = ["_static"]
html_css_files = ["dsv4site.css"]
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,   # the page's source (.ipynb / .md) for download
    "home_page_in_toc": True,
    "footer_content_items": [],
}
html_show_sourcelink = False
pygments_style = "default"
