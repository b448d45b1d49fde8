# Two commands: `make run` (whole system) and `make test` (whole suite). Everything they
# need is installed by the targets below: a virtualenv in .venv, RabbitMQ and PostgreSQL
# from Debian packages run as plain processes under .run/ (tools/infra/).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv infra-up infra-down migrate run test lint compose-check bench bench-quick bench-scale ci clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

infra-up:
	python3 -m tools.infra up

infra-down:
	python3 -m tools.infra down

migrate: venv infra-up
	set -a && . ./.run/env && set +a && $(PY) -m alembic upgrade head

run: migrate
	./scripts/run_local.sh

test: venv infra-up
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

BENCH_ARGS ?=

bench: venv
	$(PY) -m bench.run $(BENCH_ARGS)

bench-quick: venv
	$(PY) -m bench.run --quick

# The cost curve to 1,000,000 observers (issue 17): hours, not in CI. SCALE_ARGS narrows it,
# e.g. SCALE_ARGS='--sizes 10000,100000 --workloads idle'.
SCALE_ARGS ?=

bench-scale: venv
	$(PY) -m bench.scale $(SCALE_ARGS)

compose-check: venv
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec compose.yaml

ci: lint compose-check test bench-quick

clean: infra-down
	rm -rf $(VENV)
