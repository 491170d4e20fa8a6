# `make demo` and `make test` are the two commands the README opens with.
PY := .venv/bin/python

.PHONY: setup demo test conformance

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m specfill.cli.main generate --prompt "What is the capital of France?" --max-tokens 32

test: setup
	$(PY) -m pytest -q

conformance: setup
	$(PY) -m specfill.cli.main conformance --backend reference
