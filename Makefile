# Two commands on a fresh clone (Linux, Python 3.11; no GPU or conda needed):
#   make reproduce    set up .venv, measure this machine (scale from config, default cpu), render figures + report
#   make test         set up .venv, run the quick tier of the tests (every behaviour once)
#   make test-all     set up .venv, run every test (what CI runs)
#   make NAME         run one Snakemake target (a topic such as ceilings, or claims); a wrong NAME lists them
# Options: ENV=gpu (CUDA requirements), SNAKEMAKE_ARGS="--config scale=h200 machine=mybox"

ENV ?= cpu
VENV ?= .venv
PYTHON ?= python3
SNAKEMAKE_ARGS ?=
# pytest-xdist workers: one per core. loadgroup: tests marked xdist_group("name") run on one
# worker, the others wherever a worker is free. Only a speed-up: tests that share something (a
# copy of the repository, the GPU) take turns on a lock too, so they stay right where the
# installed pytest and xdist do not group (pytest 9.2 with xdist 3.8).
TEST_WORKERS ?= auto
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadgroup
STAMP := $(VENV)/.installed-$(ENV)

# Keep tools from writing into the home directory and /tmp.
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib
export IPYTHONDIR := $(CURDIR)/.cache/ipython
export JUPYTER_CONFIG_DIR := $(CURDIR)/.cache/jupyter/config
export JUPYTER_DATA_DIR := $(CURDIR)/.cache/jupyter/data
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.cache/jupyter/runtime
export CUPY_CACHE_DIR := $(CURDIR)/.cache/cupy

MAKE_TARGETS = setup reproduce figures report doc_tables test test-all lint
.PHONY: $(MAKE_TARGETS)

ifeq ($(wildcard envs/requirements-$(ENV).txt),)
$(error ENV=$(ENV) has no envs/requirements-$(ENV).txt: use ENV=cpu or ENV=gpu)
endif

$(STAMP): envs/requirements-$(ENV).txt envs/requirements-data.txt pyproject.toml
	@echo "setup 1/4: virtual environment $(VENV) ($(PYTHON))"
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install --quiet --upgrade pip
	@echo "setup 2/4: pinned requirements, envs/requirements-$(ENV).txt (the longest step: minutes on a fresh clone)"
	@$(VENV)/bin/pip install --quiet -r envs/requirements-$(ENV).txt
	@echo "setup 3/4: data packages, envs/requirements-data.txt (without their dependencies)"
	@$(VENV)/bin/pip install --quiet --no-deps -r envs/requirements-data.txt
	@echo "setup 4/4: the suite itself, editable"
	@$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation --editable .
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP)
	@echo "setup: $(VENV) is ready ($(ENV) requirements)"

reproduce: setup
	$(VENV)/bin/snakemake --cores all reproduce $(SNAKEMAKE_ARGS)
	$(VENV)/bin/snakemake --report report.html figures $(SNAKEMAKE_ARGS)

figures: setup
	$(VENV)/bin/snakemake --cores all figures $(SNAKEMAKE_ARGS)

report: setup
	$(VENV)/bin/snakemake --report report.html figures $(SNAKEMAKE_ARGS)

doc_tables: setup
	$(VENV)/bin/snakemake --cores 1 doc_tables $(SNAKEMAKE_ARGS)

test: setup
	$(VENV)/bin/python -m pytest -m "not full" $(PYTEST_XDIST) --durations=15 $(PYTEST_ARGS)

test-all: setup
	$(VENV)/bin/python -m pytest $(PYTEST_XDIST) --durations=30 $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules
	@# snakemake --lint exits non-zero for its one remaining warning (no conda/container per rule,
	@# explained in workflow/rules/common.smk); any other lint fails here.
	@mkdir -p .cache
	$(VENV)/bin/snakemake --lint > .cache/snakemake-lint.txt 2>&1 || true
	@grep -q "Lints for rule\|Congratulations" .cache/snakemake-lint.txt || { cat .cache/snakemake-lint.txt; exit 1; }
	@if grep -E '^ +\* ' .cache/snakemake-lint.txt | grep -qv 'Specify a conda environment or container'; then \
		cat .cache/snakemake-lint.txt; exit 1; fi
	@echo "snakemake --lint: only the explained conda/container warning"

# Any other name is handed to Snakemake when it is one of its targets (a topic, `claims`):
# `make ceilings` runs `snakemake --cores all ceilings`. A name that is neither lists both kinds,
# a name that is also a file or folder here (`make docs`) too: none of them is a file to make.
define HAND_TO_SNAKEMAKE
	@$(MAKE) --no-print-directory setup
	@err="$$(mktemp)"; listing="$$($(VENV)/bin/snakemake --list-target-rules 2>"$$err")" || { \
		echo "make $@: the workflow does not load:" >&2; tail -3 "$$err" >&2; rm -f "$$err"; exit 2; }; \
	rm -f "$$err"; targets="$$(printf '%s\n' "$$listing" | cut -d' ' -f1)"; \
	if printf '%s\n' $$targets | grep -qxF -- '$@'; then \
		$(VENV)/bin/snakemake --cores all $@ $(SNAKEMAKE_ARGS); \
	else \
		echo "make: no target '$@'. make targets: $(MAKE_TARGETS)." >&2; \
		echo "Snakemake targets (make NAME runs one): "$$targets"." >&2; \
		exit 2; \
	fi
endef

.DEFAULT:
	$(HAND_TO_SNAKEMAKE)

# (pyproject.toml is a prerequisite of the set-up: a phony one would redo it at every call; a
# name with ':' or '%' cannot be a target of a rule, and cannot be a Snakemake target either)
HERE := $(filter-out Makefile pyproject.toml $(MAKE_TARGETS),\
	$(foreach name,$(wildcard *),$(if $(findstring :,$(name))$(findstring %,$(name)),,$(name))))
.PHONY: $(HERE)
$(HERE):
	$(HAND_TO_SNAKEMAKE)
