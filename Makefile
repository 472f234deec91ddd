# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-all coverage clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV): on a first install pip downloads about 4 GB (torch's CUDA 13 build, DALI); its progress follows."
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

demo: $(VENV)/.installed  ## train ResNet-18 on the bundled handwritten digits (under a minute on 2 CPU cores once installed)
	$(PY) -m image_classification.demo

test: $(VENV)/.installed-dev  ## the fast suite (slow and GPU tests excluded)
	$(PY) -m pytest -q

test-all: $(VENV)/.installed-dev  ## everything that can run here, slow tests included
	$(PY) -m pytest -q -m "not gpu"

coverage: $(VENV)/.installed-dev  ## the fast suite with line coverage of image_classification/ (slower than `make test`)
	$(PY) -m pytest -q --cov=image_classification --cov-report=term

clean:
	rm -rf $(VENV) data/digits workspace
