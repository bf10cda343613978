# Two commands on a fresh machine (Python 3.11+):
#   make lab    set up .venv and open the notebooks in JupyterLab
#   make test   set up .venv and run pytest + nbval over every notebook (CPU mode on a CPU machine)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0: on the CI image this is a local CPU build (an unpinned torch pulls
# a multi-GB CUDA build). On a GPU node set TORCH to a CUDA build, e.g. TORCH=torch.
TORCH  ?= torch==2.13.0
# SGLang's production kernels are a peer, used from one file: no dependencies.
SGLANG ?= sglang==0.5.23
STAMP  := $(VENV)/.installed

.PHONY: lab test install versions clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[lab,test]"
	$(BIN)/python -m pip install -q --no-deps "$(SGLANG)"
	$(BIN)/python -m ipykernel install --sys-prefix --name dsv4lab --display-name "Python (dsv4lab)" >/dev/null
	$(BIN)/python -m pip freeze > $(VENV)/versions.txt
	touch $@

install: $(STAMP)

versions: $(STAMP)
	@grep -iE '^(torch|triton|numpy|jupyterlab|nbval|ipywidgets|pandas|matplotlib|sglang|pytest)==' $(VENV)/versions.txt

# Jupyter refuses to run as root unless told; containers often run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP)
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=notebooks $(ROOT_FLAG)

test: $(STAMP)
	@$(MAKE) --no-print-directory versions
	$(BIN)/python -m pytest tests/ -q
	$(BIN)/python -m pytest -q --nbval --nbval-current-env --nbval-cell-timeout=600 \
		--nbval-sanitize-with notebooks/sanitize.cfg notebooks/

clean:
	rm -rf $(VENV)
