# toolatlas: `make run` starts the daemon on the bundled example config; `make test` runs the suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NPM_STAMP := tests/npm/node_modules/.installed

.PHONY: run test typecheck setup npm bench clean postgres

setup: $(STAMP) postgres

# The shared-store tests (`[store] url`) run a throwaway PostgreSQL server: install the
# distribution's server packages when no initdb is on PATH or under /usr/lib/postgresql.
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		{ echo "installing PostgreSQL (for the shared-store tests)"; \
		  $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y postgresql || \
		  { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update && \
		    $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y postgresql; }; }

# torch first, pinned to the CPU wheel: a bare `torch` requirement would pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	HNSWLIB_NO_NATIVE=1 $(BIN)/pip install -q -e '.[test,store]'
	touch $@

npm: $(NPM_STAMP)

$(NPM_STAMP): tests/npm/package.json
	cd tests/npm && npm install --no-audit --no-fund --loglevel=error
	touch $@

run: $(STAMP)
	$(BIN)/python -m toolatlas.examples.run_example conf/example.toml

# mypy --strict over the whole toolatlas package (pyproject's [tool.mypy]).
typecheck: $(STAMP)
	$(BIN)/mypy --cache-dir .venv/mypy-cache

# Bytecode first: with PYTHONDONTWRITEBYTECODE set (this machine's shell sets it) nothing
# under daemon/ or tests/ is ever cached, and each of the suite's hundreds of Python
# subprocesses (daemons, CLI runs) would compile the package again, 0.3 CPU seconds a
# daemon. compileall writes the cache regardless of that variable.
# WORKERS test files at a time (module-scoped daemons stay shared within a file): a test is
# mostly a subprocess starting or a wait, which the other workers fill; four keep two cores
# busy (bench/README.md, "Stop 33").
WORKERS ?= 4
# pytest's assertion rewriting keeps its own cache (tests/**/__pycache__/*-pytest-*.pyc), written
# only where bytecode may be written: every worker collects every test module, ~10 CPU s when
# it rewrites them afresh against ~4 s from the cache. One collect-only pass writes it before
# the workers start (its errors, if any, are the real run's to report).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -p no:cacheprovider
test: $(STAMP) $(NPM_STAMP) postgres typecheck
	$(BIN)/python -m compileall -q daemon tests bench >/dev/null
	$(PYTEST) -qq --collect-only >/dev/null 2>&1 || true
	$(PYTEST) -q --durations=25 -n $(WORKERS) --dist loadfile

bench: $(STAMP) $(NPM_STAMP)
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) tests/npm/node_modules .run
