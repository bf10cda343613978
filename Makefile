# Two commands on a fresh machine (Python 3.11+):
#   make lab    set up .venv and open the notebooks in JupyterLab
#   make test   set up .venv, build the site and run pytest (with the JupyterLab and site browser
#               tests) + nbval over every notebook (CPU mode on a CPU machine)
#   make site   the lab as a website in site/_build/html/ (serve it: python -m http.server -d site/_build/html)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0: on the CI image this is a local CPU build (an unpinned torch pulls
# a multi-GB CUDA build). On a GPU node set TORCH to a CUDA build, e.g. TORCH=torch.
TORCH  ?= torch==2.13.0
# SGLang's production kernels are a peer, used from one file: no dependencies.
SGLANG ?= sglang==0.5.23
STAMP  := $(VENV)/.installed
# The browser test (tests/test_lab_browser.py) drives Debian's Chromium through Playwright.
CHROMIUM  := /usr/bin/chromium
ARTIFACTS := test-artifacts
# The website (site/conf.py): Sphinx + MyST-NB over the committed notebooks, README.md and docs/.
# MyST-NB puts its image files beside the HTML folder, so everything goes under site/_build/.
SITE      := site/_build/html

.PHONY: lab test install versions clean chromium reproduce site

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[lab,test,site]"
	$(BIN)/python -m pip install -q --no-deps "$(SGLANG)"
	$(BIN)/python -m ipykernel install --sys-prefix --name dsv4lab --display-name "Python (dsv4lab)" >/dev/null
	$(BIN)/python -m pip freeze > $(VENV)/versions.txt
	touch $@

install: $(STAMP)

versions: $(STAMP)
	@grep -iE '^(torch|triton|numpy|jupyterlab|jupyterlab_widgets|nbval|ipywidgets|pandas|matplotlib|sglang|pytest|playwright|sphinx|myst-nb|sphinx-book-theme)==' $(VENV)/versions.txt

# JupyterLab on 127.0.0.1 (a free port, a fresh token), notebooks/ open; prints the URL to open.
lab: $(STAMP)
	$(BIN)/python tools/lab_server.py

# Installs Chromium when missing, as root with apt-get (no recommends: headless needs none); else one line.
chromium:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (apt-get) for the browser test"; mkdir -p $(ARTIFACTS); \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	      chromium fonts-liberation; } > $(ARTIFACTS)/apt-chromium.log 2>&1 \
	    || { tail -20 $(ARTIFACTS)/apt-chromium.log; echo "apt-get could not install chromium"; exit 1; }; \
	    test -x $(CHROMIUM) || { echo "apt-get installed chromium but $(CHROMIUM) is missing"; exit 1; }; \
	  else \
	    echo "make test needs Chromium at $(CHROMIUM) for its browser test: sudo apt-get install -y chromium"; exit 1; \
	  fi; }

# The notebooks' saved outputs as pages (never re-executed), from scratch each time (the landing page is
# written from notebooks/ and data/runs/). Warnings are errors: a broken link, a missing image, a notebook
# outside the site's table of contents fail the build. About 10 s on 2 cores.
site: $(STAMP)
	rm -rf site/_build
	$(BIN)/python -m sphinx -b html -c site -E -d site/_build/doctrees -W --keep-going -n -q . $(SITE)
	@echo "site: $(CURDIR)/$(SITE)/index.html (serve it: $(BIN)/python -m http.server -d $(SITE))"

test: $(STAMP) chromium site
	@$(MAKE) --no-print-directory versions
	@echo "browser test screenshots: $(CURDIR)/$(ARTIFACTS)/browser/"
	$(BIN)/python -m pytest tests/ -q
	$(BIN)/python -m pytest -q --nbval --nbval-current-env --nbval-cell-timeout=600 \
		--nbval-sanitize-with notebooks/sanitize.cfg notebooks/

# The campaign replayed on a synthetic decode step (tables, plots, JSON in $(REPRODUCE_OUT)/): the full
# DSv4-Flash share on a GPU (~8 min on an H200), the small preset through Triton's interpreter on a CPU.
REPRODUCE_OUT ?= reproduce
reproduce: $(STAMP)
	$(BIN)/python -m dsv4lab reproduce --out $(REPRODUCE_OUT) $(REPRODUCE_ARGS)

clean:
	rm -rf $(VENV) site/_build
