"""The key registry: entries, their validation, and what a real server says of each key."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from support import (
    REGISTRY,
    Cli,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    write_config,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.cli import main
from pg_advisory_exporter.keys.derive import local_parts
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import check_configs


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "a"}, "give exactly one of key, pair, namespace or text"),
        ({"name": "a", "key": 1, "namespace": 2}, "(got key, namespace)"),
        ({"name": "a", "text": "x"}, "text and hash go together"),
        ({"name": "a", "key": 1, "hash": "md5"}, "text and hash go together"),
        ({"name": "a", "text": "x", "hash": "md5", "seed": 3}, "seed only applies"),
        ({"name": "a", "key": 2**63}, "less than or equal to"),
        ({"name": "a", "pair": [1, 2**31]}, "less than or equal to"),
        ({"name": "has space", "key": 1}, "String should match"),
    ],
)
def test_entry_validation(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        KeyConfig.model_validate(entry)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"name": "a", "key": 1}, {"name": "a", "key": 2}], "key name 'a' is used twice"),
        (
            [{"name": "a", "key": 7310001}, {"name": "b", "key": 7310001}],
            "keys 'a' (key 7310001) and 'b' (key 7310001) name the same lock",
        ),
        (
            [{"name": "ns", "namespace": 2001}, {"name": "one", "pair": [2001, 5]}],
            "keys 'ns' (namespace 2001) and 'one' (pair (2001, 5)) name the same lock",
        ),
        (
            [{"name": "t", "text": "billing:nightly", "hash": "md5"},
             {"name": "k", "key": 883015413106721683}],
            "keys 't' (md5('billing:nightly')) and 'k' (key 883015413106721683)",
        ),
        (
            [{"name": "x", "text": "job", "hash": "hashtextextended"},
             {"name": "y", "text": "job", "hash": "hashtextextended"}],
            "keys 'x' (hashtextextended('job', 0)) and 'y' (hashtextextended('job', 0))",
        ),
    ],
)  # fmt: skip
def test_one_lock_one_name(entries: list[dict[str, Any]], message: str) -> None:
    configs = [KeyConfig.model_validate(e) for e in entries]
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_configs(configs)


def test_the_key_spaces_do_not_clash() -> None:
    check_configs(
        [
            KeyConfig(name="big", key=5),
            KeyConfig(name="pair", pair=(0, 5)),
            KeyConfig(name="space", namespace=1),
            KeyConfig(name="other", text="job", hash="hashtextextended", seed=1),
            KeyConfig(name="same-text", text="job", hash="hashtextextended", seed=2),
        ]
    )


def test_registry_errors_name_the_entries_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    dsn = "host=db"
    path.write_text(
        yaml.safe_dump(
            {
                "keys": [{"name": "leader", "key": 42}],
                "targets": [{"name": "a", "dsn": dsn, "keys": [{"name": "again", "key": 42}]}],
            }
        )
    )
    assert main(["--config.file", str(path), "--config.check"]) == 2
    message = capsys.readouterr().err
    assert f"{path}: targets[0] (a).keys: keys 'leader' (key 42) and 'again' (key 42)" in message
    path.write_text(yaml.safe_dump({"keys": [{"name": "x", "key": 1, "colour": "red"}],
                                    "targets": [{"name": "a", "dsn": dsn}]}))  # fmt: skip
    assert main(["--config.file", str(path), "--config.check"]) == 2
    assert f"{path}: keys[0] (x).colour: unknown field" in capsys.readouterr().err


# Each digest's key as SQL computes it from documented functions (pg-boss writes its own so),
# for both byte orders and each form: PostgreSQL's encode() gives the bytes in order. (The
# server has no sha1() but in pgcrypto; PALs' own sha1 keys: test_key_libraries.py.)
DIGEST_SQL = {
    "md5": "decode(md5(%(t)s), 'hex')",
    "sha224": "sha224(convert_to(%(t)s, 'UTF8'))",
    "sha256": "sha256(convert_to(%(t)s, 'UTF8'))",
}
BYTES_SQL = (
    "SELECT get_byte(d, 0), get_byte(d, 1), get_byte(d, 2), get_byte(d, 3), "
    + "get_byte(d, 4), get_byte(d, 5), get_byte(d, 6), get_byte(d, 7), "
    + "('x' || left(encode(d, 'hex'), 16))::bit(64)::bigint FROM (SELECT {digest} AS d) AS s"
)


def test_digest_keys_are_what_the_server_computes(pg: EmbeddedPostgres) -> None:
    texts = ["billing:nightly", "cron:recalc-reward-points", "", "caf\u00e9 \u2603", "x" * 500]
    with pg.connect() as conn:
        for name, digest in DIGEST_SQL.items():
            for text in texts:
                row = conn.execute(BYTES_SQL.format(digest=digest), {"t": text}).fetchone()
                assert row is not None
                *octets, bigint = row
                prefix = bytes(octets)
                assert local_parts(name, text, "bigint", "big") == (bigint,), (name, text)
                assert local_parts(name, text, "bigint", "little") == (
                    int.from_bytes(prefix, "little", signed=True),
                )
                pair = (
                    int.from_bytes(prefix[:4], "little", signed=True),
                    int.from_bytes(prefix[4:], "little", signed=True),
                )
                assert local_parts(name, text, "pair", "little") == pair
                assert local_parts(name, text, "namespace", "little") == pair[:1]


@pytest.fixture
def exporter(
    start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str
) -> RunningExporter:
    return start_exporter(config={**one_target(monitor_dsn), "keys": REGISTRY})


def _key(key: str, datname: str = "postgres") -> dict[str, str]:
    return {"target": "main", "datname": datname, "key": key}


def _held_for(scrape: Scrape, seconds: float, name: str, **labels: str) -> bool:
    """Whether a series of these labels reports an age of `seconds` or more."""
    return any(age >= seconds for _, age in scrape.find(name, **labels))


def test_registered_keys_held_awaited_and_timed(
    exporter: RunningExporter, session: Session
) -> None:
    cron = session("reward-points-cron")
    cron.execute("SELECT pg_advisory_lock(hashtextextended('cron:recalc-reward-points', 0))")
    billing = session("billing-worker")
    billing.execute("SELECT pg_advisory_lock(7310001)")
    billing.execute(
        "SELECT pg_advisory_lock(('x' || left(md5('billing:nightly'), 16))::bit(64)::bigint)"
    )
    rebalancers = [session("rebalancer", autocommit=False) for _ in range(3)]
    for account, conn in enumerate(rebalancers, start=1):
        conn.execute("SELECT pg_advisory_xact_lock(2001, %s)", (account,))
    waiter = session("rebalancer-2", autocommit=False)
    blocked = threading.Thread(
        target=waiter.execute, args=("SELECT pg_advisory_xact_lock(2001, 1)",)
    )
    blocked.start()
    try:
        scrape = exporter.scrape_until(
            lambda s: (
                s.find("pg_advisory_key_waiters", **_key("account_rebalance"))
                == [(_key("account_rebalance"), 1.0)]
                and _held_for(s, 1.0, "pg_advisory_key_hold_seconds", **_key("reward_points_cron"))
            )
        )
    finally:
        rebalancers[0].rollback()  # lets the waiter through
        blocked.join(timeout=10)
        waiter.rollback()
    assert scrape.value("pg_advisory_key_holders", **_key("reward_points_cron")) == 1
    assert scrape.value("pg_advisory_key_hold_seconds", **_key("reward_points_cron")) >= 1.0
    assert scrape.value("pg_advisory_key_holders", **_key("nightly_billing")) == 1
    assert scrape.value("pg_advisory_key_holders", **_key("billing_nightly_md5")) == 1
    # A namespace counts every backend holding some key in it.
    assert scrape.value("pg_advisory_key_holders", **_key("account_rebalance")) == 3
    # Limits come as their own series, one per key that has one.
    assert (
        scrape.value("pg_advisory_key_max_hold_seconds", target="main", key="nightly_billing")
        == 7200
    )
    assert (
        scrape.value("pg_advisory_key_max_hold_seconds", target="main", key="reward_points_cron")
        == 600
    )
    assert scrape.find("pg_advisory_key_max_hold_seconds", key="account_rebalance") == []


def test_singleton_not_held_exports_zero_and_leader_is_no_leak(
    exporter: RunningExporter, session: Session
) -> None:
    # Nobody holds the leader lock yet: an explicit 0 in its database.
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_key_holders", **_key("billing_leader", "billing")) == 0
    assert scrape.find("pg_advisory_key_holders", key="billing_leader", datname="postgres") == []

    session("leader-elector", dbname="billing").execute("SELECT pg_advisory_lock(42)")
    session("leader-elector").execute("SELECT pg_advisory_lock(42)")  # not registered here
    leader = {"target": "main", "application_name": "leader-elector"}
    scrape = exporter.scrape_until(
        lambda s: _held_for(
            s, 1.0, "pg_advisory_idle_holder_max_seconds", **leader, datname="postgres"
        )
    )
    assert scrape.value("pg_advisory_key_holders", **_key("billing_leader", "billing")) == 1
    assert scrape.find("pg_advisory_key_holders", key="billing_leader", datname="postgres") == []
    assert scrape.value("pg_advisory_holders", **leader, datname="billing", state="idle") == 1
    # Held on purpose: left out of the leak signal. The same app in a database where the
    # key is not registered as long-lived is an ordinary idle holder.
    assert scrape.find("pg_advisory_idle_holder_max_seconds", **leader, datname="billing") == []
    assert (
        scrape.value(
            "pg_advisory_idle_holder_max_seconds", **leader, datname="postgres", state="idle"
        )
        >= 1.0
    )


@pytest.mark.any_version  # `check`'s report of names
def test_check_report_shows_registry_names(
    tmp_path: Path, monitor_dsn: str, session: Session, cli: Cli
) -> None:
    session("billing-worker").execute("SELECT pg_advisory_lock(7310001)")
    path = write_config(
        tmp_path, {"keys": REGISTRY, "targets": [{"name": "main", "dsn": monitor_dsn}]}
    )
    report = cli("check", "--config.file", str(path), check=True).stdout
    holder = next(
        line for line in report.splitlines() if "'billing-worker'" in line and "7310001" in line
    )
    assert "nightly_billing" in holder
    assert "Registered keys (5)" in report
    leader = next(line for line in report.splitlines() if line.strip().startswith("billing_leader"))
    assert leader.split()[1:4] == ["billing", "0", "0"]


def test_a_server_side_hash_clash_is_reported_by_name(
    start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str
) -> None:
    keys = [
        {"name": "cron", "text": "cron:recalc-reward-points", "hash": "hashtextextended"},
        {"name": "literal", "key": 6110350855857795459},  # the same key, spelled out
    ]
    exporter = start_exporter(config={**one_target(monitor_dsn), "keys": keys})
    assert exporter.scrape().value("pg_advisory_up", target="main") == 0
    assert "keys 'cron' (hashtextextended('cron:recalc-reward-points', 0)) and 'literal'" in (
        exporter.log()
    )
