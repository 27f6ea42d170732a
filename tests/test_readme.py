"""The README's configuration examples are valid configurations."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pg_advisory_exporter.config import FileConfig
from pg_advisory_exporter.registry import check_configs

README = Path(__file__).parent.parent / "README.md"


def _yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_file_example_is_valid(tmp_path: Path) -> None:
    configs = [yaml.safe_load(block) for block in _yaml_blocks()]
    files = [c for c in configs if "targets" in c]
    assert files, "the README has no configuration file example"
    secret = tmp_path / "secret"
    secret.write_text("pw")
    for data in files:
        # The example's secret files exist only in production.
        for owner in [
            *data["targets"],
            *(p for t in data["targets"] for p in t.get("poolers", ())),
        ]:
            if "password_file" in owner:
                owner["password_file"] = str(secret)
        FileConfig.model_validate(data)


def test_the_registry_example_is_valid() -> None:
    registries = [c["keys"] for c in map(yaml.safe_load, _yaml_blocks()) if c.get("keys")]
    assert registries, "the README has no key registry example"
    for keys in registries:
        config = FileConfig.model_validate(
            {"keys": keys, "targets": [{"name": "a", "dsn": "host=db"}]}
        )
        check_configs(config.keys)
