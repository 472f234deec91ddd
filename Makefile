# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# the suite runs on one pytest-xdist worker per CPU core, at most 4 (each worker imports torch), a test
# module on one worker in its own order (tests/conftest.py hands out the longest modules first)
# a test that runs 20 minutes has hung (the longest take about a minute, several under load): it fails alone
PYTEST_ARGS := -q -n auto --maxprocesses 4 --dist loadscope --timeout 1200
PYTEST := $(PY) -m pytest $(PYTEST_ARGS)
# test-pins and test-oldest: a venv per torch/torchvision pair under .venv-pins/, made with $(PYTHON)
PINNED_SUITE = $(PYTHON) scripts/pinned_suite.py$(if $(filter 1,$(DALI)), --dali)
# what test-oldest runs: the modules that exercise torch's API most (training, the engine, the models,
# inference, checkpoints, optimizers, fp16's loss scaling, EMA, losses)
CORE_TESTS := tests/test_training.py tests/test_engine.py tests/test_models.py tests/test_inference.py \
	tests/test_checkpoint.py tests/test_optim.py tests/test_fp16.py tests/test_ema.py tests/test_losses.py

.PHONY: demo test test-all test-slow test-pins test-oldest coverage clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV): on a first install pip downloads about 4 GB (torch's CUDA 13 build, DALI); its progress follows."
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -r requirements.txt
	touch $@

# the package itself, editable (the source tree is what runs), for the ic-* commands in $(VENV)/bin; its
# dependencies are requirements.txt's. PIP_FLAGS: more pip options (tests/test_packaging.py runs this
# target offline with --no-index --no-build-isolation)
$(VENV)/.installed-package: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --disable-pip-version-check -q --no-deps $(PIP_FLAGS) --editable .
	@# setuptools (84, in pip's isolated build) leaves its egg-info in the tree; the installed package needs none
	rm -rf image_classification.egg-info
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-package requirements-dev.txt
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

demo: $(VENV)/.installed-package  ## train ResNet-18 on the bundled handwritten digits (how long it took, and on which machine: README.md, "Set-up")
	$(PY) -m image_classification.demo

test: $(VENV)/.installed-dev  ## the fast suite (slow and GPU tests excluded)
	$(PYTEST)

test-all: $(VENV)/.installed-dev  ## everything that can run here, slow tests included
	$(PYTEST) -m "not gpu"

test-slow: $(VENV)/.installed-dev  ## the slow tests of the test modules that cover what changed since main (SINCE=)
	$(PY) scripts/slow_tests.py --run --since $(or $(SINCE),main) -- $(PYTEST_ARGS)

# e.g. make test-pins TORCH=2.11.0 TORCHVISION=0.26.0 [PYTHON=python3.12] [DALI=1]
test-pins:  ## the fast suite on other torch and torchvision versions (TORCH=, TORCHVISION=)
	$(PINNED_SUITE) --torch "$(TORCH)" --torchvision "$(TORCHVISION)" -- $(PYTEST_ARGS)

test-oldest:  ## the suite's core on the oldest torch and torchvision that pyproject.toml accepts
	$(PINNED_SUITE) --oldest -- $(PYTEST_ARGS) $(CORE_TESTS)

coverage: $(VENV)/.installed-dev  ## the fast suite with line coverage of image_classification/ (slower than `make test`)
	$(PYTEST) --cov=image_classification --cov-report=term

clean:
	rm -rf $(VENV) .venv-pins data/digits workspace
