# One line per target; see README.md.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Editable installs in compat mode: a .pth file puts this checkout on sys.path, so edits
# (new modules too) take effect without reinstalling, and Spark's lookup of installed
# `pyspark_*` modules finds pyspark_lakelog (the default editable mode's import hook hides
# it from that lookup). setuptools calls compat mode transitional; its successor, strict
# mode, puts a tree of links on sys.path instead (found by Spark too; a new module then
# needs `make install` again). -qq: no build-backend banners for a newcomer to wonder about.
INSTALL := $(BIN)/pip install -qq --config-settings editable_mode=compat --editable

.PHONY: help install run spark test lint bench chaos clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' Makefile | sed 's/:.*## /\t/'

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Stamps: what each install put into the venv (a newer pyproject.toml installs again).
$(VENV)/.run: pyproject.toml | $(BIN)/python
	$(INSTALL) .
	touch $@

$(VENV)/.spark: pyproject.toml | $(BIN)/python
	$(INSTALL) '.[spark]'
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(INSTALL) '.[dev]'
	touch $@

install: $(VENV)/.run  ## create .venv and install lakelog with what running it needs

run: install  ## run lakelog on its embedded default (SQLite + file://./data) on 127.0.0.1
	$(BIN)/lakelog serve

spark: install $(VENV)/.spark  ## add the spark extra (PySpark; needs Java 17+) to .venv

lint: $(VENV)/.dev  ## ruff and mypy (installs the dev tools)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Two test processes (modules stay whole: they share clusters), then the tests that
# restart PostgreSQL, alone.
test: lint  ## lint, then the whole test suite
	$(BIN)/pytest -n 3 --dist loadfile -m "not serial" --durations=40
	$(BIN)/pytest -m serial

bench: $(VENV)/.dev  ## run every benchmark (prints JSON lines)
	$(INSTALL) '.[dev,bench]'
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# The whole-system checker (tests/chaos): a cluster of real processes under seeded
# clients and faults for MINUTES, its history checked against a log model; exits 1 on
# any anomaly. SEED replays a run's schedule of operations.
MINUTES ?= 10
PROFILE ?= postgres
SEED ?=
chaos: $(VENV)/.dev  ## chaos run and check: MINUTES=10 PROFILE=postgres|sqlite|sharded SEED=n
	$(BIN)/python -m tests.chaos --minutes $(MINUTES) --profile $(PROFILE) $(if $(SEED),--seed $(SEED))

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
