# bnstudy: `make book` (the published book, from the data release in release/: nothing trained) or
# `make book PROFILE=quick` (a smoke run of every training path) or PROFILE=full (recompute every page, hours);
# `make release` (recompute the data release), `make verify-release`; `make test`; `make bench`.
PROFILE ?= release
CHAPTERS ?= all
UNITS ?= 5
N_JOBS ?=
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bnstudy-installed
export BNSTUDY_CACHE_DIR ?= $(CURDIR)/.cache/bnstudy

.PHONY: venv chapters book test bench clean clean-cache release verify-release readme history wheel

# Set-up: a venv in the repo. torch is installed first and pinned exactly; TORCH_INDEX (optional) is the
# package index to take it from, e.g. PyTorch's CPU-only wheel index on a machine without a GPU.
$(STAMP): pyproject.toml
	@echo "bnstudy set-up (1/3): creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "bnstudy set-up (2/3): installing torch==2.13.0 (several hundred MB; minutes on a cold pip cache)"
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	@echo "bnstudy set-up (3/3): installing bnstudy and its dependencies (Jupyter Book, papermill, ...)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)
	@echo "bnstudy set-up done: $(VENV)"

venv: $(STAMP)

# Execute every chapter with papermill into chapters/NN-name.ipynb beside the sources (fails loudly on any cell
# error); tables and figures go to results/ and figures/. PROFILE=release (default): each page analyses the release's rows.
chapters: $(STAMP)
ifeq ($(PROFILE),release)
	$(PY) -m bnstudy.study.book --release
else
	$(PY) -m bnstudy.study.book --profile $(PROFILE)
endif

# Recompute the data release at the full profile (hours for all chapters on two cores; CHAPTERS=03,04 for some;
# resumable: finished runs are in the run cache). Rewrites release/ tables, units and manifest.json.
release: $(STAMP)
	$(PY) -m bnstudy.study.release compute --chapters $(CHAPTERS) $(if $(N_JOBS),--n-jobs $(N_JOBS))

# Recompute UNITS seeded random units per chapter from an empty cache and compare every column with ==.
# RECORD=1 writes the verification into release/manifest.json (the date the pages' run lines cite).
verify-release: $(STAMP)
	$(PY) -m bnstudy.study.release verify --chapters $(CHAPTERS) --units $(UNITS) $(if $(N_JOBS),--n-jobs $(N_JOBS)) $(if $(RECORD),--record)

# Build the HTML from the executed notebooks (the book's root is the top level: _config.yml, _toc.yml; the pages that
# are not chapters are in book/, their old addresses redirect there); warnings are errors.
book: chapters
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	$(MAKE) --no-print-directory wheel WHEEL_DIR=_build/html/dist
	@echo "Book: $(CURDIR)/_build/html/index.html"

# The release history page (book/history.md) from release/claims/: each release's claims table and what changed.
history: $(STAMP)
	$(PY) -m bnstudy.study.history page

# The practitioner's library as a wheel (needs torch and numpy only; the study machinery's dependencies are the
# `study` extra), into WHEEL_DIR: `make book` puts it in the built book, whose install line links it
# (<Documentation URL>/dist/bnstudy-<version>-py3-none-any.whl). Built from a clean build/ so that no stale module
# enters it; with the venv's own setuptools when it has one that pyproject.toml accepts (seconds), else in pip's
# isolated build environment (fetches setuptools from the package index).
WHEEL_DIR ?= dist
WHEEL_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
wheel:
	rm -rf build
	$(WHEEL_PY) -m pip wheel --quiet --no-deps --wheel-dir $(WHEEL_DIR) \
	  $$($(WHEEL_PY) -c "import setuptools, wheel; assert int(setuptools.__version__.split('.')[0]) >= 68" 2>/dev/null && echo --no-build-isolation) .
	rm -rf build

# The README's "What the chapters find", made from the built book's front page (run after `make book`).
readme: $(STAMP)
	$(PY) -m bnstudy.study.book --readme

# The whole suite on TEST_WORKERS processes (pytest-xdist; default: one per core): each book is built once, on one
# worker, with the tests that read it (tests/conftest.py's xdist groups). Prints the 15 slowest tests.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

bench: $(STAMP)
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_numerics.py

clean:
	rm -rf _build results figures chapters/.partial chapters/[0-9][0-9]-*.ipynb

clean-cache:
	@test -n "$(BNSTUDY_CACHE_DIR)" || { echo "BNSTUDY_CACHE_DIR is empty; nothing removed"; exit 1; }
	rm -rf "$(BNSTUDY_CACHE_DIR)"

# Chapter 7 (issue 15): the freeze audit on every torchvision classification model with a norm layer (slow).
.PHONY: test-torchvision-all
test-torchvision-all: $(STAMP)
	$(PY) -m pytest -q -m torchvision_all tests/test_audit_torchvision.py
