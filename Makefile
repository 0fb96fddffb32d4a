# Two entry points a newcomer needs: `make demo` and `make test`. Each installs what it needs and
# no more: the demo needs only ibmon itself; the tests add pytest, hypothesis, mypy, ruff and the
# manifest validators (the `test` extra) to the same venv.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

# One stamp per install level, inside the venv so that deleting .venv resets them. Each depends on
# pyproject.toml (changed dependencies reinstall). Installing the test extra also satisfies the
# runtime stamp; a venv made by `make demo` gets the test extra the first time `make test` runs.
PY       = $(BIN)/python
RUNTIME  = $(VENV)/.installed-runtime
TESTDEPS = $(VENV)/.installed-test
# pytest-xdist workers for `make test` (0 runs in one process). Each worker takes whole test files
# (--dist loadfile: a module's simulator or broker is started once) in collection order, so the
# long end-to-end and fault files start first instead of last. One worker per core: the fault
# tests' deadlines (a poll overdue after 3 intervals) assume the daemon under test gets a core.
# `--durations` keeps the slowest tests in sight.
TEST_WORKERS ?= 2

.PHONY: demo test lint bench venv system-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): pyproject.toml | $(PY)
	$(BIN)/pip install --quiet -e .
	touch $@

$(TESTDEPS): pyproject.toml | $(PY)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(RUNTIME)

## A development venv: ibmon (editable) plus the test extra.
venv: $(TESTDEPS)

## Run ibmon on the simulated fabric (metrics on http://127.0.0.1:9683/metrics).
demo: $(RUNTIME)
	$(BIN)/ibmon demo

system-deps:
	bash scripts/system-deps.sh

## Everything CI runs: system packages when missing, venv, lint, type check, full test suite.
test: system-deps $(TESTDEPS) lint
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

lint: $(TESTDEPS)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(TESTDEPS)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
