# `make lab` installs the course into .venv on first use and opens JupyterLab on the work folder.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_DIR := $(abspath $(VENV))
# The learner's own copy of course/ (untracked): JupyterLab opens there, and so do its terminals.
WORK ?= work
LAB ?= $(VENV_DIR)/bin/jupyter lab
LAB_ARGS ?=
# Jupyter refuses to start as root (containers, CI) unless told to.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
# PyTorch build: auto (the CPU build on Linux without an NVIDIA GPU), cpu, default or an index URL.
TORCH_INDEX ?= auto
STAMP := $(VENV)/.installed

.PHONY: lab install clean-venv

# What learners use: the course and its runtime dependencies, no test tools.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.10 or newer is needed; got " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@test -x $(PY) || { echo "[1/4] creating $(VENV)/"; $(PYTHON) -m venv $(VENV); }
	@echo "[2/4] PyTorch (the largest part: a few minutes on a first install)"
	@TORCH_INDEX="$(TORCH_INDEX)" $(PY) scripts/install_torch.py
	@echo "[3/4] the course and its dependencies (pip install -e .)"
	$(PY) -m pip install --progress-bar on -e .
	@echo "[4/4] JupyterLab extensions"
	@$(VENV)/bin/jupyter labextension list >/dev/null 2>&1 || true
	@touch $(STAMP)
	@echo "Installed into $(VENV)/ ($$(du -sh $(VENV) 2>/dev/null | cut -f1))."

install: $(STAMP)

# JupyterLab on the work folder (filled from course/ first; never overwritten), with the course's
# environment exported so that its terminals run the commands the course prints as printed, and
# binder/jupyter as configuration: only the student side of nbgrader (validate), as on Binder. It is
# started in the work folder, where its terminals open (TDD_WORK). A second `make lab` on the same
# work folder prints the running server's address instead.
lab: $(STAMP)
	@$(PY) -m autograder workspace --into "$(WORK)" --before-lab || { status=$$?; [ $$status -eq 3 ] && exit 0; exit $$status; }; \
	export PATH="$(VENV_DIR)/bin:$$PATH" VIRTUAL_ENV="$(VENV_DIR)" TDD_WORK="$(abspath $(WORK))" \
	  JUPYTER_CONFIG_PATH="$(CURDIR)/binder/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"; \
	cd "$(WORK)" && exec $(LAB) --notebook-dir="$(abspath $(WORK))" $(ROOT_ARGS) $(LAB_ARGS)

clean-venv:
	rm -rf $(VENV)

# --- instructor and developer targets (a student edition has only the targets above) ---
# `make test` runs every test; it installs the test tools (pytest, pytest-xdist, Playwright, kubernetes-validate) first.
PYTEST_ARGS ?=
RELEASE_ARGS ?=
TEST_STAMP := $(VENV)/.installed-test
# Two test workers; the tests that read one session run (a grading batch, a chapter's nbgrader autograde,
# JupyterLab) go to the same worker (tests/conftest.py). WORKERS=0 runs everything in one process.
WORKERS ?= 2
XDIST := $(if $(filter 0,$(WORKERS)),-p no:xdist,-n $(WORKERS) --dist loadgroup)

.PHONY: test check release student-edition bench hub hub-install

$(TEST_STAMP): $(STAMP) pyproject.toml
	@echo "the test tools (pip install -e '.[test]')"
	$(PY) -m pip install --progress-bar on -e '.[test]'
	@touch $(TEST_STAMP)

test: $(TEST_STAMP)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop (about 2 minutes): library, registry, checks and mutants, selected by marker: no notebooks,
# browser, sandbox, training, or course commands run in a child process (make test runs those).
check: $(TEST_STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow and not browser and not sandbox and not subprocess and not train" $(PYTEST_ARGS)

# Regenerate the student release course/ from autograder/source/ (nbgrader generate_assignment).
# Notebooks changed after their release are kept: RELEASE_ARGS=--force discards them.
release: $(STAMP)
	$(PY) -m autograder release $(RELEASE_ARGS)

# A repository for learners of a graded course:
#   make student-edition DEST=../course-student ANSWERS="01_attention_by_hand" [CHAPTERS="02_multi_head_attention"]
# ANSWERS: the chapters whose answers are released (the others' are withheld); CHAPTERS: the chapters it opens
# (default: every chapter whose prerequisites' answers are released).
student-edition: $(STAMP)
	@test -n "$(DEST)" || { echo 'usage: make student-edition DEST=folder [ANSWERS="01_name 02_name"] [CHAPTERS="03_name"]'; exit 2; }
	$(PY) -m autograder publish "$(DEST)" $(foreach a,$(ANSWERS),--answers $(a)) $(foreach c,$(CHAPTERS),--chapters $(c))

# The course on JupyterHub, on this server, for a try-out (as root; docs/grading.md, "On a JupyterHub"):
#   sudo make hub HUB_COURSE=/srv/ml101/course HUB_EDITION=/srv/ml101/edition HUB_INSTRUCTORS=ada
# JupyterHub comes from PyPI (the hub extra), configurable-http-proxy from npm into deploy/jupyterhub/node_modules.
HUB_PROXY := deploy/jupyterhub/node_modules/.bin/configurable-http-proxy
HUB_PORT ?= 8000
$(HUB_PROXY): deploy/jupyterhub/package.json deploy/jupyterhub/package-lock.json
	@command -v npm >/dev/null || { echo "make hub needs npm for configurable-http-proxy (apt-get install npm)"; exit 2; }
	npm ci --prefix deploy/jupyterhub --no-audit --no-fund
	@touch $@

hub-install: $(STAMP) $(HUB_PROXY)
	@$(PY) -c 'import jupyterhub' 2>/dev/null || $(PY) -m pip install --progress-bar on -e '.[hub]'

hub: hub-install
	@test "$$(id -u)" = 0 || { echo "make hub runs as root (sudo make hub ...): the hub reads /etc/shadow and starts each server as its user"; exit 2; }
	@test -n "$(HUB_COURSE)" -a -n "$(HUB_EDITION)" || { echo 'usage: sudo make hub HUB_COURSE=/srv/ml101/course HUB_EDITION=/srv/ml101/edition HUB_INSTRUCTORS="ada grace" [HUB_PORT=8000]'; exit 2; }
	TDD_HUB_COURSE="$(HUB_COURSE)" TDD_HUB_EDITION="$(HUB_EDITION)" TDD_HUB_INSTRUCTORS="$(HUB_INSTRUCTORS)" \
	  TDD_HUB_PORT="$(HUB_PORT)" exec $(VENV)/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

# Every budget of COURSE.md in one run (about 10 minutes); BENCH_ARGS="--training vit": the ViT row alone.
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m solutions.bench $(BENCH_ARGS)
