# The README's two commands are `make run` and `make test`; both set up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# auto | cpu | cuda: which fbgemm build to install (auto: cuda when nvidia-smi lists a GPU)
EMBNB_FBGEMM ?= auto
# extra pytest arguments, e.g. make test PYTEST_ARGS="-k routing -x"
PYTEST_ARGS ?=
export PYTHON VENV EMBNB_FBGEMM

.PHONY: setup run test lab check-notebooks strip-notebooks clean

setup:
	@bash scripts/setup_env.sh

run: setup
	$(PY) -m embnb.harness run

test: setup
	@bash scripts/run_tests.sh $(PYTEST_ARGS)

lab: setup
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(VENV)/bin/jupyter lab notebooks

check-notebooks: setup
	$(PY) -m embnb.harness check

strip-notebooks: setup
	$(PY) -m embnb.harness strip notebooks/*.ipynb

clean:
	rm -rf build .pytest_cache .hypothesis
