# Two entry points a newcomer needs: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test lint bench venv system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## Run ibmon on the simulated fabric (metrics on http://127.0.0.1:9683/metrics).
demo: $(STAMP)
	$(BIN)/ibmon demo

system-deps:
	bash scripts/system-deps.sh

## Everything CI runs: system packages when missing, venv, lint, type check, full test suite.
test: system-deps $(STAMP) lint
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
