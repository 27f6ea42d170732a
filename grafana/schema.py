"""The dashboard read back through Grafana's own models (grafana-foundation-sdk, Grafana 11.6
schema): what a model does not know it drops, so a field Grafana does not know, or one in the
wrong place, comes back missing or changed, and is named here.

The dashboard's own model leaves a panel's plugin options, its field config's `custom` part
and its queries as plain objects; each is read again with its plugin's model (the panel
type's, Prometheus' for the queries)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard, prometheus, stat, table, timeseries

# The panel types the dashboard uses, by their plugin's models of options and custom config.
_PLUGINS: Mapping[str, Any] = {"timeseries": timeseries, "stat": stat, "table": table}


def _encoded(value: object) -> Any:
    return json.loads(json.dumps(value, cls=JSONEncoder))


def _differences(given: Any, back: Any, path: str) -> Iterator[str]:
    if isinstance(given, dict) and isinstance(back, dict):
        for key in sorted(set(given) | set(back)):
            where = f"{path}.{key}"
            if key not in back:
                yield f"{where}: not in Grafana's schema here"
            elif key not in given:
                yield f"{where}: added by Grafana's model"
            else:
                yield from _differences(given[key], back[key], where)
    elif isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        for index, (item, read) in enumerate(zip(given, back, strict=True)):
            yield from _differences(item, read, f"{path}[{index}]")
    elif given != back:
        yield f"{path}: {given!r} reads back as {back!r}"


def unknown_fields(document: Mapping[str, Any]) -> list[str]:
    """Where `document` (a dashboard's JSON) says what Grafana's models do not: empty when
    every field is known, in its place. (The models read values as they are given: a value of
    the wrong type is not found here.)"""
    found = list(
        _differences(document, _encoded(dashboard.Dashboard.from_json(dict(document))), "$")
    )
    for number, panel in enumerate(document.get("panels", [])):
        where = f"$.panels[{number}]"
        if panel.get("type") == "row":
            continue
        plugin = _PLUGINS.get(panel.get("type", ""))
        if plugin is None:
            found.append(f"{where}.type: {panel.get('type')!r} is not a panel type checked here")
            continue
        options = panel.get("options", {})
        found += _differences(
            options, _encoded(plugin.Options.from_json(options)), f"{where}.options"
        )
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None and hasattr(plugin, "FieldConfig"):
            found += _differences(
                custom,
                _encoded(plugin.FieldConfig.from_json(custom)),
                f"{where}.fieldConfig.defaults.custom",
            )
        for index, query in enumerate(panel.get("targets", [])):
            found += _differences(
                query, _encoded(prometheus.Dataquery.from_json(query)), f"{where}.targets[{index}]"
            )
    return found
