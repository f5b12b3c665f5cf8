# The README's two commands are `make run` and `make test`; both set up first.
# STACK picks a point of the supported range: pinned (torch 2.13, fbgemm 1.8,
# torchrec 1.8; .venv), min (torch 2.11, fbgemm 1.6, torchrec 1.6.1 on
# Python 3.12; .venv-min) or top (torch 2.14.1, fbgemm 1.9, torchrec 1.9.2;
# .venv-top), e.g. `make test STACK=min`.
STACK ?= pinned
ifeq ($(STACK),min)
VENV := .venv-min
else ifeq ($(STACK),top)
PYTHON ?= python3
VENV := .venv-top
else
PYTHON ?= python3
VENV := .venv
endif
PY := $(VENV)/bin/python
# auto | cpu | cuda: which fbgemm build to install (auto: cuda when nvidia-smi lists a GPU)
EMBNB_FBGEMM ?= auto
# extra pytest arguments, e.g. make test PYTEST_ARGS="-k routing -x"
PYTEST_ARGS ?=
export PYTHON VENV EMBNB_FBGEMM STACK

.PHONY: setup run test test-browser test-gpu-kit lab check-notebooks strip-notebooks clean

setup:
	@bash scripts/setup_env.sh

run: setup
	$(PY) -m embnb.harness run

test: setup
	@bash scripts/run_tests.sh $(PYTEST_ARGS)

# The notebooks in a real JupyterLab in headless chromium (installs chromium
# and Playwright where it can; tests/browser, which `make test` leaves out).
test-browser: setup
	@bash scripts/test_browser.sh $(PYTEST_ARGS)

# The GPU kit on CPU: gather its wheels (< 48 MiB) and run its command in a
# stand-in for the GPU machine (Python 3.12, torch 2.11, nothing else of ours).
test-gpu-kit: setup
	@bash scripts/test_gpu_kit.sh

lab: setup
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(VENV)/bin/jupyter lab notebooks

check-notebooks: setup
	$(PY) -m embnb.harness check

strip-notebooks: setup
	$(PY) -m embnb.harness strip notebooks/*.ipynb

clean:
	rm -rf build .pytest_cache .hypothesis
