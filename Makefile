# The two commands a newcomer needs: `make demo` runs the gateway in front of a demo MCP
# server; `make test` runs the whole test suite. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test install bench conformance

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/tollhouse demo

# The whole suite runs once per database backend: SQLite, then the PostgreSQL at
# 127.0.0.1:5432 (trust auth; TOLLHOUSE_TEST_POSTGRES_URL to point elsewhere), each test on a
# fresh database. `make test TEST_DATABASES=sqlite` runs the SQLite pass alone.
TEST_DATABASES ?= sqlite postgresql

test: $(VENV)/.installed
	@set -e; for backend in $(TEST_DATABASES); do \
		echo "== the test suite on $$backend"; \
		TOLLHOUSE_TEST_DATABASE=$$backend $(VENV)/bin/python -m pytest $(PYTEST_ARGS); \
	done

# The official MCP conformance suite, directly against an official-SDK server and through the
# gateway, both eras; the same test is part of `make test` (README, "The conformance suite").
# It installs the two pinned suite releases (and Node 22 when the machine's node is older)
# from the npm registry into .conformance/ on first use.
conformance: $(VENV)/.installed
	TOLLHOUSE_TEST_DATABASE=$${TOLLHOUSE_TEST_DATABASE:-sqlite} $(VENV)/bin/python -m pytest tests/conformance $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	$(VENV)/bin/python bench/run.py
