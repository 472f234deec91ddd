# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# the suite runs on one pytest-xdist worker per CPU core, at most 4 (each worker imports torch), a test
# module on one worker in its own order (tests/conftest.py hands out the longest modules first)
PYTEST := $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadscope

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
	$(PYTEST)

test-all: $(VENV)/.installed-dev  ## everything that can run here, slow tests included
	$(PYTEST) -m "not gpu"

coverage: $(VENV)/.installed-dev  ## the fast suite with line coverage of image_classification/ (slower than `make test`)
	$(PYTEST) --cov=image_classification --cov-report=term

clean:
	rm -rf $(VENV) data/digits workspace
