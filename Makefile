# The two commands a newcomer needs: `make demo` runs the gateway in front of a demo MCP
# server; `make test` runs the whole test suite. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test install bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/tollhouse demo

# The database tests run on SQLite and on the PostgreSQL at 127.0.0.1:5432 (trust auth);
# TOLLHOUSE_TEST_DATABASE=sqlite make test skips the PostgreSQL runs.
TOLLHOUSE_TEST_DATABASE ?= all
export TOLLHOUSE_TEST_DATABASE

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest

bench: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	$(VENV)/bin/python bench/run.py
