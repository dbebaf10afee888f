# The two commands: `make lab` opens the course, `make test` runs every test.
# Both create .venv on first use and install the package with its extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LAB_ARGS ?=
# Jupyter refuses to start as root (containers, CI) unless told to.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
PYTEST_ARGS ?=
STAMP := $(VENV)/.installed

.PHONY: lab test check install release bench clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.10 or newer is needed; got " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	$(VENV)/bin/jupyter labextension list >/dev/null 2>&1 || true
	@touch $(STAMP)

install: $(STAMP)

# binder/jupyter: only the student side of nbgrader (assignment list, validate), as on Binder.
lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/binder/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(VENV)/bin/jupyter lab --notebook-dir=course $(ROOT_ARGS) $(LAB_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: library, registry, checks and mutants; no notebooks, browser, sandbox or training.
check: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser and not sandbox" --ignore-glob='tests/test_train_*' $(PYTEST_ARGS)

# Regenerate the student release course/ from autograder/source/ (nbgrader generate_assignment).
release: $(STAMP)
	$(PY) -m autograder release

bench: $(STAMP)
	$(PY) -m solutions.bench

clean-venv:
	rm -rf $(VENV)
