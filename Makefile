# Two commands: `make run` (whole system) and `make test` (whole suite). Everything they
# need is installed by the targets below: a virtualenv in .venv, RabbitMQ and PostgreSQL
# from Debian packages run as plain processes under .run/ (tools/infra/).
VENV ?= .venv
# Which RabbitMQ: 4.3 (the default), 4.0 or 3.10 (docs/broker-versions.md), e.g.
# `make test RABBITMQ=4.0`. Each runs from Debian's package (tools/infra/brokers.py).
RABBITMQ ?=
export ORCH_RABBITMQ := $(RABBITMQ)
# Which PostgreSQL: 15 (the default, the host's Debian 12 package) or 17 (Debian 13's, run in
# a debootstrap root: tools/infra/pg_series.py), e.g. `make test-postgres POSTGRES=17`.
POSTGRES ?=
export ORCH_POSTGRES := $(POSTGRES)
# How many RabbitMQ nodes: 1 (the default) or a cluster, e.g. `make run BROKER_NODES=3`
# (tools/infra/cluster.py); .run/env then lists every node in ORCH_AMQP_URLS and sets
# ORCH_QUEUE_TYPE=quorum.
BROKER_NODES ?=
export ORCH_BROKER_NODES := $(BROKER_NODES)
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: venv infra-up infra-down migrate run test test-unit test-broker test-quorum test-postgres lint compose-check alerts-check bench bench-quick bench-tls bench-traces bench-versions bench-scale bench-cluster ci clean

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

# The pure tests (tests/unit: no broker, no database), in seconds; CI runs them first.
test-unit: venv
	$(PY) -m pytest $(PYTEST_ARGS) tests/unit

# The tests of the broker's semantics, which CI runs on every supported RabbitMQ besides the
# default (docs/broker-versions.md): the core flow, the consumer timeout, fencing, failover
# and SIGTERM handoff, broker restart, broker data lost, chaos, a cancelled consumer, and the
# start channel (aiormq's internals against the broker), consumer priorities and records, and
# start queues past ORCH_START_QUEUES emptied and deleted.
LOWERED = test_start_queues.py::test_lowered_start_queues_are_emptied_into_the_ones_kept_and_deleted_with_nothing_run_twice
BROKER_TESTS = $(addprefix tests/system/,test_lifecycle.py test_ack_timeout.py test_fencing.py \
	test_failover.py test_broker_restart.py \
	test_reliability.py::test_the_broker_rebuilt_from_the_database test_chaos.py \
	test_consumer_cancel.py test_start_channel.py test_brokers.py test_consumer_priority.py test_consumer_records.py \
	test_queue_markers.py $(LOWERED))
# ...and again on quorum queues: how a quorum queue's deletion reaches its consumers differs
# by series (before 4.3 its bindings go last), and so do its counts of consumers.
BROKER_QUORUM_TESTS = $(addprefix tests/system/,test_consumer_cancel.py $(LOWERED))

test-broker: venv infra-up
	$(PY) -m pytest $(PYTEST_ARGS) $(BROKER_TESTS)
	$(PY) -m pytest --queue-type=quorum $(PYTEST_ARGS) $(BROKER_QUORUM_TESTS)

# Placement, even load, drains, a pool over several start queues and a start queue deleted
# with every queue a quorum queue, on the one node (a cluster's queues are quorum): a quorum
# queue keeps a cancelled consumer's record, redelivers otherwise, and is cancelled before
# its record goes; the races of consuming again differ.
QUORUM_TESTS = $(addprefix tests/system/,test_placement.py test_balance.py test_start_queues.py test_consumer_cancel.py test_queue_markers.py)

test-quorum: venv infra-up
	$(PY) -m pytest --queue-type=quorum $(PYTEST_ARGS) $(QUORUM_TESTS)

# The tests that lean on the database, which CI runs on PostgreSQL 17 besides the default 15
# (docs/broker-versions.md), in about 3 minutes: the core flow, the migrations (every one, on
# the template database) and their lock, asyncpg's errors sorted, the server stopped under a
# manager, the switchover to a streaming replica, and TLS to the database
# (its world migrates over TLS; a certificate the client cannot verify is refused). The slower
# variants of each stay in `make test` (each migration's own test, the network cut, the hot
# standby, a restored backup, a run over TLS end to end): CI's time is the limit.
PG_TESTS = $(addprefix tests/system/,test_lifecycle.py::test_create_runs_on_a_live_service_and_is_visible \
	test_migrations.py::test_two_upgrades_at_once_take_turns test_db_errors.py \
	test_db_outage.py::test_postgres_down_answers_503_and_the_manager_recovers \
	test_db_failover.py::test_a_switchover_under_load_loses_nothing_and_applies_nothing_twice \
	test_tls.py::test_a_database_certificate_the_client_cannot_verify_or_a_wrong_host_is_refused)

test-postgres: venv infra-up
	$(PY) -m pytest $(PYTEST_ARGS) $(PG_TESTS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

BENCH_ARGS ?=

bench: venv
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.tls
	$(PY) -m bench.traces

# TLS off and on in one run: create and failover (issue 63)
TLS_ARGS ?=
bench-tls: venv
	$(PY) -m bench.tls $(TLS_ARGS)

# Traces off, at the documented sampling and always on, alternated in one run: create (issue 63)
TRACES_ARGS ?=
bench-traces: venv
	$(PY) -m bench.traces $(TRACES_ARGS)

bench-quick: venv
	$(PY) -m bench.run --quick

# create, failover, stop, density and broker memory on 4.3 and 3.10, side by side
VERSIONS_ARGS ?=

bench-versions: venv
	$(PY) -m bench.versions $(VERSIONS_ARGS)

# The cost curve to 1,000,000 observers (issue 17): hours, not in CI. SCALE_ARGS narrows it,
# e.g. SCALE_ARGS='--sizes 10000,100000 --workloads idle'.
SCALE_ARGS ?=

bench-scale: venv
	$(PY) -m bench.scale $(SCALE_ARGS)

# One node against the 3-node cluster in one run, and the broker's disk after 1,000 failovers
# (issue 55; about 10 minutes here). CLUSTER_ARGS="--size 3000 --failovers 100" for a quick look.
CLUSTER_ARGS ?=

bench-cluster: venv
	$(PY) -m bench.cluster $(CLUSTER_ARGS)

compose-check: venv
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec compose.yaml compose.cluster.yaml

# The monitoring files of deploy/ (about 15 s): promtool (Debian's prometheus package, unpacked
# under .run/promtool on first use: tools/infra/promtool.py) checks the example configuration,
# the alert rules and their unit tests (deploy/prometheus/alerts.test.yml); then
# tests/system/test_alerts.py runs `promtool check metrics` on a real manager's and service's
# /metrics and finds there every metric the rules and the Grafana dashboard query.
PROMTOOL := python3 -m tools.infra promtool

alerts-check: venv infra-up
	$(PROMTOOL) check config deploy/prometheus/prometheus.yml
	$(PROMTOOL) check rules deploy/prometheus/alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/alerts.test.yml
	$(PY) -m pytest $(PYTEST_ARGS) tests/system/test_alerts.py

ci: lint compose-check alerts-check test bench-quick

clean: infra-down
	rm -rf $(VENV)
