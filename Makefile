# One line per target; see README.md.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: help install run test lint bench clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' Makefile | sed 's/:.*## /\t/'

$(BIN)/lakelog: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/lakelog  ## create .venv and install lakelog with its dev tools

run: install  ## run lakelog on its embedded default (SQLite + file://./data)
	$(BIN)/lakelog serve

lint: install  ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Two test processes (modules stay whole: they share clusters), then the tests that
# restart PostgreSQL, alone.
test: lint  ## lint, then the whole test suite
	$(BIN)/pytest -n 2 --dist loadfile -m "not serial"
	$(BIN)/pytest -m serial

bench: install  ## run every benchmark (prints JSON lines)
	$(BIN)/pip install -q -e '.[dev,bench]'
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
