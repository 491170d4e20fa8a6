# `make demo` and `make test` are the two commands the README opens with.
PY := .venv/bin/python

.PHONY: setup demo test conformance

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m specfill.cli.main generate --prompt "What is the capital of France?" --max-tokens 32

# one pytest worker per core (at most 4), each test file whole in one worker (its module fixtures
# and servers stay together), the files with a slow test first (tests/conftest.py orders them; xdist's
# own reordering, by test count, is off); TEST_WORKERS=0 runs the suite in this process, as `pytest -q` does
TEST_WORKERS ?= auto

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile --no-loadscope-reorder

conformance: setup
	$(PY) -m specfill.cli.main conformance --backend reference
