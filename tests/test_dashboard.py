"""The Grafana dashboard: the committed JSON is fresh, lints clean, and every query finds data."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from log_events import every_event
from promql_lint import LABEL_VALUES, VARIABLES, Dashboard, Panel, lint, panels
from support import (
    PG_MAJOR,
    REGISTRY,
    SUITE_LOG_PREFIX,
    OneTarget,
    QueryError,
    RunningExporter,
    Session,
    StartExporter,
    StartService,
    load_yaml_all,
    prometheus_api,
    start_prometheus,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres
from grafana import dashboard
from pg_advisory_exporter.collect.reads import READS
from pg_advisory_exporter.metrics import SPECS

ROOT = Path(__file__).parent.parent
DASHBOARD = ROOT / "grafana" / "pg-advisory-exporter.json"


def _committed() -> Dashboard:
    loaded: Dashboard = json.loads(DASHBOARD.read_text())
    return loaded


def test_the_committed_dashboard_is_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    dashboard.main()  # what `python -m grafana.dashboard` (make generate) prints
    generated = capsys.readouterr().out
    assert generated == DASHBOARD.read_text(), (
        f"{DASHBOARD.relative_to(ROOT)} is stale: run `make generate` and commit the result"
    )


def test_the_dashboard_lints_clean() -> None:
    problems = lint(_committed())
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_every_series_of_the_contract() -> None:
    exprs = " ".join(t["expr"] for p in panels(_committed()) for t in p["targets"])
    unused = {name for name in SPECS if not re.search(rf"\b{name}\{{", exprs)}
    # Build information and the server version are labels to look up, not something to watch;
    # a refused reload is an alert's matter (PgAdvisoryExporterWebConfigRefused,
    # PgAdvisoryExporterConfigRefused). Extensions' own locks have no panel yet: every panel's
    # queries must return series in the real Prometheus of the test below, whose scenario
    # takes none (tests/test_extension_tags.py builds what takes them).
    assert unused == {
        "pg_advisory_extension_locks",
        "pg_advisory_log_extension_lock_waits_total",
        "pg_advisory_exporter_build_info",
        "pg_advisory_server_info",
        "pg_advisory_exporter_web_config_last_reload_successful",
        "pg_advisory_exporter_config_last_reload_successful",
        "pg_advisory_exporter_config_last_reload_success_timestamp_seconds",
    }


def _panel(dashboard: Dashboard, title: str) -> Panel:
    return next(p for p in dashboard["panels"] if p["title"] == title)


def _variable(dashboard: Dashboard, name: str) -> dict[str, Any]:
    return next(v for v in dashboard["templating"]["list"] if v["name"] == name)


def _edit_expr(title: str, old: str, new: str) -> Callable[[Dashboard], None]:
    def edit(dashboard: Dashboard) -> None:
        target = _panel(dashboard, title)["targets"][0]
        assert old in target["expr"], target["expr"]
        target["expr"] = target["expr"].replace(old, new)

    return edit


@pytest.mark.parametrize(
    ("break_it", "problem"),
    [
        (lambda d: d.update(uid="x"), "uid is 'x'"),
        (lambda d: d.update(tags=["postgresql"]), "tags lack"),
        (lambda d: d.update(links=[]), "no link to the runbook"),
        (lambda d: d.update(__inputs=[]), "has __inputs"),
        (lambda d: d.update(editable=True), "is editable"),
        (lambda d: d["templating"]["list"].pop(0), "exactly one datasource variable"),
        (lambda d: _variable(d, "target").update(multi=False), "target is not multi-select"),
        (lambda d: _variable(d, "datname").update(allValue=".+"), "allValue should be .*"),
        (lambda d: _variable(d, "job").update(refresh=1), "job does not refresh on time"),
        (
            lambda d: _variable(d, "target").update(datasource={"uid": "prom"}),
            "target does not use ${datasource}",
        ),
        (
            lambda d: _variable(d, "datname").update(
                query='label_values(pg_advisory_deadlocks_total{job=~"$job"}, datname)'
            ),
            'variable datname: pg_advisory_deadlocks_total does not filter target=~"$target"',
        ),
        (
            lambda d: _variable(d, "application_name").update(
                query='label_values(pg_advisory_up{job=~"$job"}, application_name)'
            ),
            "pg_advisory_up has no label application_name",
        ),
        (lambda d: d["templating"]["list"].pop(), "no query variable application_name"),
        (
            lambda d: _variable(d, "job").update(
                query='label_values(pg_advisory_up{target=~"$target"}, job)'
            ),
            "variable job: filters ['target'], not only earlier ones",
        ),
        (lambda d: _panel(d, "Waiters").update(description=""), "no title or no description"),
        (lambda d: _panel(d, "Deadlocks")["fieldConfig"]["defaults"].pop("unit"), "invalid unit"),
        (
            lambda d: _panel(d, "Waiters").update(datasource={"uid": "P1"}),
            "'Waiters' does not use ${datasource}",
        ),
        (
            lambda d: _panel(d, "Waiters")["targets"][0].update(datasource={"uid": "P1"}),
            "'Waiters' target A does not use ${datasource}",
        ),
        (lambda d: _panel(d, "Waiters").update(targets=[]), "has no targets"),
        (
            _edit_expr("Deadlocks", "[$__rate_interval]", "[5m]"),
            "range [5m] is not [$__rate_interval]",
        ),
        (
            _edit_expr("Failed collections", "[$__rate_interval]", "[1m]"),
            "rate() does not use [$__rate_interval]",
        ),
        (_edit_expr("Waiters", 'job=~"$job", ', ""), 'does not filter job=~"$job"'),
        (_edit_expr("Waiters", 'target=~"$target", ', ""), 'does not filter target=~"$target"'),
        (
            _edit_expr("Waiters", 'application_name=~"$application_name"', 'app=~"x"'),
            "pg_advisory_waiters has no label app",
        ),
        (
            _edit_expr("Waiters", "pg_advisory_waiters", "pg_advisory_waiting"),
            "pg_advisory_waiting is not in the metric contract",
        ),
        (
            _edit_expr("Deadlocks", "increase(", "max_over_time("),
            "counter pg_advisory_deadlocks_total is not inside rate/irate/increase",
        ),
        (
            _edit_expr("Servers up", "sum(pg_advisory_up{", "sum(pg_advisory_up + up{"),
            "pg_advisory_up is used without label matchers",
        ),
        (
            _edit_expr("Deadlocks", "by (target, datname)", "by (target, database)"),
            "groups by database",
        ),
        (
            _edit_expr(
                "Waiters by application",
                "by (target, datname, application_name) (",
                "by (target) (",
            ),
            "legend uses {{datname}}",
        ),
        (
            _edit_expr("Waiters", 'datname=~"$datname"', 'datname=~"postgres"'),
            'does not filter datname=~"$datname"',
        ),
        (lambda d: _panel(d, "Waiters").update(id=2), "panel ids are not distinct"),
        (lambda d: d.pop("refresh"), "no refresh"),
    ],
)
def test_the_linter_finds_each_kind_of_mistake(
    break_it: Callable[[Dashboard], object], problem: str
) -> None:
    broken = copy.deepcopy(_committed())
    break_it(broken)
    problems = lint(broken)
    assert any(problem in p for p in problems), problems


# -- Live: every query of the dashboard against a real Prometheus ---------------------------

RATE_INTERVAL = "15s"  # four scrape intervals, as Grafana's $__rate_interval would be
BUILTIN_VARIABLES = {"__rate_interval": RATE_INTERVAL, "__interval": "1s", "__range": "60s"}


def substitute(query: str) -> str:
    """Grafana's interpolation with every variable at "All" (its allValue, .*)."""

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        assert name in VARIABLES, f"unknown variable ${name} in {query}"
        return ".*"

    return re.sub(r"\$\{?(\w+)\}?", value, query)


@contextmanager
def seed_scenarios(session: Session) -> Iterator[None]:
    """The README's scenarios, held open from real sessions."""
    # The leaked lock: a session lock on the registered nightly_billing key, then idle.
    session("billing-worker").execute("SELECT pg_advisory_lock(7310001)")
    # signup-api: a transaction lock on an e-mail's key, idle in transaction ...
    signup = session("signup-api", autocommit=False)
    email_key = "SELECT pg_advisory_xact_lock(1001, hashtext(lower('ada@example.com')))"
    signup.execute(email_key)
    # ... shared locks of the account_rebalance namespace ...
    for _ in range(2):
        session("report-reader").execute("SELECT pg_advisory_lock_shared(2001, 81234)")
    # ... a few hundred transaction locks in one transaction ...
    session("bulk-import", autocommit=False).execute(
        "SELECT pg_advisory_xact_lock(4001, g) FROM generate_series(1, 300) AS g"
    )
    # ... the leader lock and a negative key in the billing database ...
    session("leader-elector", dbname="billing").execute("SELECT pg_advisory_lock(42)")
    session("billing-cron", dbname="billing").execute("SELECT pg_advisory_lock(-7310001)")
    # ... Que's locker holding three jobs' keys while their workers run them (idle by design,
    # named as Que names it: the catalog's que_locker) ...
    session("que", dbname="billing").execute(
        "SELECT set_config('application_name', 'Que Locker: ' || pg_backend_pid(), false), "
        "pg_advisory_lock(g) FROM generate_series(900001, 900003) AS g"
    )
    # ... and a second signup request waiting for the first.
    waiter = session("signup-api", autocommit=False)
    blocked = threading.Thread(target=waiter.execute, args=(email_key,))
    blocked.start()
    try:
        yield
    finally:
        signup.rollback()  # lets the waiter through
        blocked.join(timeout=10)
        waiter.rollback()


class Prometheus:
    def __init__(self, port: int) -> None:
        self.port = port

    def get(self, path: str, **params: str) -> Any:
        """The `data` of an API answer."""
        return prometheus_api(self.port, path, **params)

    def wait_for_samples(self, count: int, timeout: float = 30.0) -> None:
        """Until the exporter has been scraped `count` times within the rate interval."""
        query = f"count_over_time(pg_advisory_up[{RATE_INTERVAL}]) >= {count}"
        wait_until(
            lambda: bool(self.instant(query)),
            timeout,
            f"Prometheus scraped the exporter {count} times",
            0.5,
        )

    def instant(self, expr: str) -> list[Any]:
        return list(self.get("query", query=expr)["result"])

    def range(self, expr: str) -> list[Any]:
        end = time.time()
        data = self.get("query_range", query=expr, start=str(end - 30), end=str(end), step="1")
        return list(data["result"])

    def label_values(self, query: str) -> list[Any]:
        """A query variable's label_values(selector, label), as Grafana asks for it."""
        parsed = LABEL_VALUES.match(query)
        assert parsed, query
        end = time.time()
        matching = {"match[]": parsed[1], "start": str(end - 60), "end": str(end)}
        return list(self.get(f"label/{parsed[2]}/values", **matching))


def _start_prometheus(
    start_service: StartService, tmp_path: Path, exporter: RunningExporter
) -> Prometheus:
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "pg-advisory",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
            }
        ],
    }
    return Prometheus(start_prometheus(start_service, tmp_path, config))


def _empty_queries(prometheus: Prometheus, dashboard: Dashboard) -> list[str]:
    """Every query of the dashboard that returns no series (or fails), as `where: query`."""
    checks: list[tuple[str, str, Callable[[str], list[Any]]]] = [
        (f"variable {v['name']}", substitute(v["query"]), prometheus.label_values)
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    checks += [
        (
            f"{panel['title']} ({target['refId']})",
            substitute(target["expr"]),
            prometheus.instant if target.get("instant") else prometheus.range,
        )
        for panel in panels(dashboard)
        for target in panel["targets"]
    ]
    # What only a newer server has is absent here (collect/reads.py; tests/test_pg19.py).
    newer = [name for read in READS if read.since > PG_MAJOR * 10000 for name in read.series]
    empty = []
    for where, query, run in checks:
        if any(name in query for name in newer):
            continue
        try:
            if not run(query):
                empty.append(f"{where}: {query}")
        except QueryError as error:
            empty.append(f"{where}: {query}: {error}")
    return empty


@pytest.mark.slow
def test_every_query_returns_series_from_a_real_prometheus(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    session: Session,
    start_service: StartService,
    tmp_path: Path,
) -> None:
    config = one_target(monitor_dsn, name="orders")
    # Every client here connects from 127.0.0.1: a transaction pooler known by that address
    # makes the seeded idle session-lock holders stranded locks.
    config["targets"][0]["poolers"] = [
        {"name": "pgbouncer", "addresses": ["127.0.0.1/32"], "pool_mode": "transaction"}
    ]
    # The suite's server's log, where what happens between scrapes is written.
    config["targets"][0]["server_log"] = {"path": str(pg.logfile), "line_prefix": SUITE_LOG_PREFIX}
    # A web configuration file with a rate limit, for its refusals' series (never reached).
    web_config = tmp_path / "web-config.yml"
    web_config.write_text("rate_limit:\n  interval: 1s\n  burst: 1000\n")
    exporter = start_exporter(
        "--web.external-url", "http://exporter.example.com",
        "--web.config.file", str(web_config),
        config={**config, "keys": REGISTRY},
    )  # fmt: skip
    with seed_scenarios(session):
        exporter.scrape_until(lambda s: sum(v for _, v in s.find("pg_advisory_waiters")) == 1)
        every_event(pg.dsn(), pg.logfile)
        exporter.scrape_until(lambda s: bool(s.find("pg_advisory_log_lock_wait_seconds_total")))
        prometheus = _start_prometheus(start_service, tmp_path, exporter)
        prometheus.wait_for_samples(5)
        empty = _empty_queries(prometheus, _committed())
    assert not empty, "queries of the dashboard that return no series:\n" + "\n".join(empty)


# -- Kubernetes: the ConfigMap Grafana's sidecar loads --------------------------------------


def test_kustomize_builds_the_sidecar_configmap(kubectl: str) -> None:
    built = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    resources = {doc["kind"]: doc for doc in load_yaml_all(built)}
    assert set(resources) == {"ConfigMap", "PrometheusRule"}
    configmap = resources["ConfigMap"]
    assert configmap["metadata"]["name"] == "pg-advisory-exporter-dashboard"
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert configmap["data"] == {"pg-advisory-exporter.json": DASHBOARD.read_text()}
