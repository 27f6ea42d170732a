"""The Grafana dashboard: the committed JSON is fresh, lints clean, and every query finds data."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from conftest import RunningExporter
from test_registry import REGISTRY

from exporter.metrics import SPECS
from exporter.rules import RUNBOOK_URL

ROOT = Path(__file__).parent.parent
DASHBOARD = ROOT / "grafana" / "pg-advisory-exporter.json"
UID = "pg-advisory-locks"
TAGS = {"postgresql", "advisory-locks", "pg-advisory-exporter"}
DATASOURCE_UIDS = {"$datasource", "${datasource}"}
# The query variables, in the order each narrows the next; each filters its own label.
VARIABLES = ("job", "target", "datname", "application_name")
SCRAPE_LABELS = frozenset({"job", "instance"})  # Prometheus adds them to every series
BUILTIN_METRICS: dict[str, frozenset[str]] = {"up": frozenset()}
# Grafana unit ids (a subset of dashboard-linter's panel-units-rule list).
UNITS = {
    "none", "short", "percent", "percentunit", "bool", "bool_yes_no", "bytes", "decbytes",
    "ns", "µs", "ms", "s", "m", "h", "d", "dtdurations", "dateTimeAsIso", "dateTimeFromNow",
    "ops", "cps", "reqps", "rps",
}  # fmt: skip
RANGE_FUNCTIONS = ("rate", "irate", "increase")
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip

Dashboard = dict[str, Any]
Session = Callable[..., psycopg.Connection[Any]]


def _committed() -> Dashboard:
    loaded: Dashboard = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(dashboard: Dashboard) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_the_committed_dashboard_is_fresh() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "grafana.dashboard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert generated == DASHBOARD.read_text(), (
        f"{DASHBOARD.relative_to(ROOT)} is stale: run `make generate` and commit the result"
    )


# -- The linter: dashboard-linter's rules that apply, and this exporter's contract ------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[([^\]]*)\]")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_TOP_AGGREGATION = re.compile(r"^\s*(?:sum|max|min|avg|count)\s*(?:by\s*\(([^()]*)\)\s*)?\(")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


def _labels_of(metric: str) -> frozenset[str]:
    if metric in SPECS:
        return frozenset(SPECS[metric].labels) | SCRAPE_LABELS
    return BUILTIN_METRICS[metric] | SCRAPE_LABELS


def _matchers(body: str) -> dict[str, tuple[str, str]] | None:
    """{label: (operator, value)} of a selector's braces, or None if they do not parse."""
    found: dict[str, tuple[str, str]] = {}
    position = 0
    while position < len(body.rstrip()):
        match = _MATCHER.match(body, position)
        if match is None:
            return None
        found[match[1]] = (match[2], match[3])
        position = match.end()
    return found


def _call_argument(expr: str, open_paren: int) -> str:
    """The text between the parenthesis at `open_paren` and its match."""
    depth = 0
    for index in range(open_paren, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[index], 0)
        if depth == 0:
            return expr[open_paren + 1 : index]
    return expr[open_paren + 1 :]


def lint_selector(metric: str, body: str, needs: tuple[str, ...]) -> list[str]:
    """One `metric{body}`: known metric, real labels, and a `=~"$var"` for each of `needs`
    that the metric carries (job always)."""
    if metric not in SPECS and metric not in BUILTIN_METRICS:
        return [f"{metric} is not in the metric contract (exporter.metrics.SPECS)"]
    matchers = _matchers(body)
    if matchers is None:
        return [f"{metric}{{{body}}}: cannot parse the matchers"]
    labels = _labels_of(metric)
    problems = [f"{metric} has no label {label}" for label in matchers if label not in labels]
    for variable in needs:
        if variable in labels and matchers.get(variable) != ("=~", f"${variable}"):
            problems.append(f'{metric} does not filter {variable}=~"${variable}"')
    return problems


def _selectors(expr: str) -> list[tuple[str, str, str]]:
    """(metric, matchers, text) of each `metric{matchers}` in the expression."""
    return [(m[1] or "", m[2], m[0]) for m in _SELECTOR.finditer(expr)]


def _known_labels(expr: str) -> frozenset[str]:
    labels = [_labels_of(m) for m, _, _ in _selectors(expr) if m in SPECS or m in BUILTIN_METRICS]
    return frozenset().union(*labels)


def _selector_problems(expr: str) -> list[str]:
    """Known metrics, real labels, every variable that applies (target-job-rule and
    target-instance-rule for our variables); counters only inside rate/irate/increase
    (target-counter-agg-rule)."""
    problems = []
    for metric, body, text in _selectors(expr):
        if not metric:
            problems.append(f"{text}: a selector without a metric name")
            continue
        problems += lint_selector(metric, body, VARIABLES)
        functions = "|".join(RANGE_FUNCTIONS)
        inside = rf"\b(?:{functions})\(\s*{re.escape(text)}\[\$__rate_interval\]\)"
        if metric in SPECS and SPECS[metric].kind == "counter" and not re.search(inside, expr):
            problems.append(f"counter {metric} is not inside rate/irate/increase")
    # A metric name written without braces filters nothing.
    rest = _GROUPING.sub("", _RANGE.sub("", _SELECTOR.sub("{}", _STRING.sub('""', expr))))
    problems += [
        f"{name} is used without label matchers"
        for name, call in _IDENTIFIER.findall(rest)
        if not call and name not in KEYWORDS
    ]
    return problems


def _range_problems(expr: str) -> list[str]:
    """target-rate-interval-rule, for rate, irate and increase alike."""
    problems = [
        f"range [{duration}] is not [$__rate_interval]"
        for duration in _RANGE.findall(expr)
        if duration != "$__rate_interval"
    ]
    for call in re.finditer(rf"\b({'|'.join(RANGE_FUNCTIONS)})\s*\(", expr):
        if not _call_argument(expr, call.end() - 1).rstrip().endswith("[$__rate_interval]"):
            problems.append(f"{call[1]}() does not use [$__rate_interval]")
    return problems


def _label_problems(expr: str, legend: str) -> list[str]:
    """by/on/without/ignoring/group_* name labels of the metrics; the legend's labels survive
    the outermost aggregation."""
    known = _known_labels(expr)
    problems = [
        f"groups by {label}, which none of its metrics has"
        for grouping in _GROUPING.findall(expr)
        for label in filter(None, (part.strip() for part in grouping.split(",")))
        if label not in known
    ]
    aggregation = _TOP_AGGREGATION.match(expr)
    result = known
    if aggregation is not None:
        result = frozenset(part.strip() for part in (aggregation[1] or "").split(","))
    problems += [
        f"legend uses {{{{{label}}}}}, which the query's result lacks"
        for label in _LEGEND_LABEL.findall(legend)
        if label not in result
    ]
    return problems


def lint_expr(expr: str, legend: str = "") -> list[str]:
    return _selector_problems(expr) + _range_problems(expr) + _label_problems(expr, legend)


def lint_panel(panel: dict[str, Any]) -> list[str]:
    """panel-title-description-rule, panel-units-rule, panel-datasource-rule,
    panel-no-targets-rule, target-datasource-rule, and each query."""
    problems = []
    if not panel.get("title") or not panel.get("description"):
        problems.append("has no title or no description")
    if panel.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
        problems.append("does not use ${datasource}")
    field_config = panel.get("fieldConfig", {})
    units = [field_config.get("defaults", {}).get("unit")]
    units += [
        prop["value"]
        for override in field_config.get("overrides", [])
        for prop in override["properties"]
        if prop["id"] == "unit"
    ]
    problems += [f"has no or an invalid unit: {unit!r}" for unit in units if unit not in UNITS]
    targets = panel.get("targets") or []
    if not targets:
        problems.append("has no targets")
    ref_ids = [t.get("refId") for t in targets]
    if len(set(ref_ids)) != len(ref_ids) or not all(ref_ids):
        problems.append(f"refIds are not distinct: {ref_ids}")
    for target in targets:
        where = f"target {target.get('refId')}"
        if target.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
            problems.append(f"{where} does not use ${{datasource}}")
        problems += [
            f"{where}: {problem}"
            for problem in lint_expr(target.get("expr", ""), target.get("legendFormat", ""))
        ]
    return problems


def lint_variables(dashboard: Dashboard) -> list[str]:
    """template-datasource-rule, template-job/instance-rule for our four variables (chained),
    template-on-time-change-reload-rule."""
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    problems = []
    datasources = [v for v in variables.values() if v["type"] == "datasource"]
    if [(v["name"], v.get("query"), v.get("label")) for v in datasources] != [
        ("datasource", "prometheus", "Data source")
    ]:
        problems.append("needs exactly one datasource variable, 'datasource' of prometheus")
    for name, variable in variables.items():
        if variable["type"] == "query":
            if variable.get("refresh") != 2:
                problems.append(f"variable {name} does not refresh on time range change")
            if variable.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
                problems.append(f"variable {name} does not use ${{datasource}}")
    for position, name in enumerate(VARIABLES):
        variable = variables.get(name)
        if variable is None or variable["type"] != "query":
            problems.append(f"no query variable {name}")
            continue
        if not (variable.get("multi") and variable.get("includeAll")):
            problems.append(f"variable {name} is not multi-select with All")
        if variable.get("allValue") != ".*":
            problems.append(f"variable {name}: allValue should be .*")
        query = _LABEL_VALUES.match(variable.get("query", ""))
        if query is None or query[2] != name:
            problems.append(f"variable {name}: query is not label_values(..., {name})")
            continue
        selector = _SELECTOR.fullmatch(query[1])
        metric, body = (selector[1], selector[2]) if selector else (query[1], "")
        narrowed_by = VARIABLES[:position]
        problems += [f"variable {name}: {p}" for p in lint_selector(metric, body, narrowed_by)]
        if (metric in SPECS or metric in BUILTIN_METRICS) and name not in _labels_of(metric):
            problems.append(f"variable {name}: {metric} has no label {name}")
        extra = set(_matchers(body) or {}) - set(narrowed_by)
        if extra:
            problems.append(f"variable {name}: filters {sorted(extra)}, not only earlier ones")
    return problems


def lint(dashboard: Dashboard) -> list[str]:
    problems = []
    if dashboard.get("uid") != UID:
        problems.append(f"uid is {dashboard.get('uid')!r}, not {UID!r}")
    missing_tags = TAGS - set(dashboard.get("tags", []))
    if missing_tags:
        problems.append(f"tags lack {sorted(missing_tags)}")
    if RUNBOOK_URL not in [link.get("url") for link in dashboard.get("links", [])]:
        problems.append("no link to the runbook")
    if "__inputs" in dashboard:
        problems.append("has __inputs, which file provisioning does not resolve")
    if dashboard.get("editable", True):
        problems.append("is editable (uneditable-dashboard)")
    if not dashboard.get("refresh") or not dashboard.get("time"):
        problems.append("has no refresh or no time range")
    problems += lint_variables(dashboard)
    ids = [p.get("id") for p in dashboard["panels"]]
    if len(set(ids)) != len(ids) or None in ids:
        problems.append(f"panel ids are not distinct: {ids}")
    for panel in _panels(dashboard):
        problems += [f"panel {panel.get('title')!r} {p}" for p in lint_panel(panel)]
    return problems


def test_the_dashboard_lints_clean() -> None:
    problems = lint(_committed())
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_every_series_of_the_contract() -> None:
    exprs = " ".join(t["expr"] for p in _panels(_committed()) for t in p["targets"])
    unused = {name for name in SPECS if not re.search(rf"\b{name}\{{", exprs)}
    # Build information and the server version are labels to look up, not something to watch.
    assert unused == {"pg_advisory_exporter_build_info", "pg_advisory_server_info"}


def _panel(dashboard: Dashboard, title: str) -> dict[str, Any]:
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
            _edit_expr("Targets up", "sum(pg_advisory_up{", "sum(pg_advisory_up + up{"),
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


class QueryError(Exception):
    """Prometheus refused a query; the message is its error."""


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        """The `data` of an API answer."""
        url = f"{self.base}/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)["data"]
        except urllib.error.HTTPError as error:
            raise QueryError(json.load(error).get("error")) from None

    def wait_for_samples(self, count: int, timeout: float = 30.0) -> None:
        """Until the exporter has been scraped `count` times within the rate interval."""
        query = f"count_over_time(pg_advisory_up[{RATE_INTERVAL}]) >= {count}"
        deadline = time.monotonic() + timeout
        while not self.instant(query):
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus has not scraped the exporter {count} times in {timeout}s")
            time.sleep(0.5)

    def instant(self, expr: str) -> list[Any]:
        return list(self.get("query", query=expr)["result"])

    def range(self, expr: str) -> list[Any]:
        end = time.time()
        data = self.get("query_range", query=expr, start=str(end - 30), end=str(end), step="1")
        return list(data["result"])

    def label_values(self, query: str) -> list[Any]:
        """A query variable's label_values(selector, label), as Grafana asks for it."""
        parsed = _LABEL_VALUES.match(query)
        assert parsed, query
        end = time.time()
        matching = {"match[]": parsed[1], "start": str(end - 60), "end": str(end)}
        return list(self.get(f"label/{parsed[2]}/values", **matching))


def _start_prometheus(
    start_service: Callable[..., int], tmp_path: Path, exporter: RunningExporter
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
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = start_service(
        "prometheus",
        "--config.file=prometheus.yml",
        "--storage.tsdb.path=prometheus-data",
        ready_path="/-/ready",
    )
    return Prometheus(port)


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
        for panel in _panels(dashboard)
        for target in panel["targets"]
    ]
    empty = []
    for where, query, run in checks:
        try:
            if not run(query):
                empty.append(f"{where}: {query}")
        except QueryError as error:
            empty.append(f"{where}: {query}: {error}")
    return empty


@pytest.mark.slow
def test_every_query_returns_series_from_a_real_prometheus(
    start_exporter: Callable[..., RunningExporter],
    one_target: Callable[..., dict[str, Any]],
    monitor_dsn: str,
    session: Session,
    start_service: Callable[..., int],
    tmp_path: Path,
) -> None:
    exporter = start_exporter(config={**one_target(monitor_dsn, name="orders"), "keys": REGISTRY})
    with seed_scenarios(session):
        exporter.scrape_until(lambda s: sum(v for _, v in s.find("pg_advisory_waiters")) == 1)
        prometheus = _start_prometheus(start_service, tmp_path, exporter)
        prometheus.wait_for_samples(5)
        empty = _empty_queries(prometheus, _committed())
    assert not empty, "queries of the dashboard that return no series:\n" + "\n".join(empty)


# -- Kubernetes: the ConfigMap Grafana's sidecar loads --------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_the_sidecar_configmap() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    resources = {doc["kind"]: doc for doc in yaml.safe_load_all(built)}
    assert set(resources) == {"ConfigMap", "PrometheusRule"}
    configmap = resources["ConfigMap"]
    assert configmap["metadata"]["name"] == "pg-advisory-exporter-dashboard"
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert configmap["data"] == {"pg-advisory-exporter.json": DASHBOARD.read_text()}
