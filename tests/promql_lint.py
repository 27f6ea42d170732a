"""A linter for the Grafana dashboard: the rules of grafana/dashboard-linter that apply to
it, and this exporter's metric contract (known metrics and labels, counters only inside
rate/irate/increase, every variable filtered). Each finding is a line of text."""

from __future__ import annotations

import re
from typing import Any

from pg_advisory_exporter.alerting.rules import RUNBOOK_URL
from pg_advisory_exporter.metrics import SPECS

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

# Grafana's JSON model, as loaded from the file.
Dashboard = dict[str, Any]
Panel = dict[str, Any]


def panels(dashboard: Dashboard) -> list[Panel]:
    """The dashboard's panels, rows left out."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[([^\]]*)\]")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_TOP_AGGREGATION = re.compile(r"^\s*(?:sum|max|min|avg|count)\s*(?:by\s*\(([^()]*)\)\s*)?\(")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


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


def lint_panel(panel: Panel) -> list[str]:
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
        query = LABEL_VALUES.match(variable.get("query", ""))
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
    """Every problem of the dashboard, its variables, its panels and their queries."""
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
    for panel in panels(dashboard):
        problems += [f"panel {panel.get('title')!r} {p}" for p in lint_panel(panel)]
    return problems
