"""The demo's advisory lock scenarios, held open from real sessions while the real exporter is
scraped."""

from __future__ import annotations

import threading

from support import (
    Cli,
    LoggedReads,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    exporter_sessions,
    report_section,
)

from devtools.embedded_postgres import EmbeddedPostgres


def _labels(application_name: str, datname: str = "postgres") -> dict[str, str]:
    return {"target": "main", "datname": datname, "application_name": application_name}


def _age_at_least(scrape: Scrape, seconds: float, **labels: str) -> bool:
    """Whether an idle holder of these labels has been idle for `seconds` or more."""
    found = scrape.find("pg_advisory_idle_holder_max_seconds", **labels)
    return any(age >= seconds for _, age in found)


def test_leaked_session_lock_shows_an_idle_holder_whose_age_grows(
    exporter: RunningExporter, session: Session
) -> None:
    leaked = session("billing-worker")
    leaked.execute("SELECT pg_advisory_lock(7310001)")

    first = exporter.scrape()
    app = _labels("billing-worker")
    assert first.value("pg_advisory_up", target="main") == 1
    assert first.value("pg_advisory_holders", **app, state="idle") == 1
    assert first.value("pg_advisory_locks", **app, mode="exclusive", granted="true") == 1
    assert first.value("pg_advisory_waiters", **app) == 0
    age = first.value("pg_advisory_idle_holder_max_seconds", **app, state="idle")

    later = exporter.scrape_until(
        lambda s: _age_at_least(s, age + 1.0, **app, state="idle"), timeout=10
    )
    assert later.value("pg_advisory_idle_holder_max_seconds", **app, state="idle") >= age + 1.0

    leaked.execute("SELECT pg_advisory_unlock(7310001)")
    released = exporter.scrape()
    assert released.find("pg_advisory_holders", **app) == []
    assert released.find("pg_advisory_idle_holder_max_seconds", **app) == []


def test_waiter_and_the_length_of_its_wait(exporter: RunningExporter, session: Session) -> None:
    holder = session("signup-api", autocommit=False)
    holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('signup:an@example.com', 0))")
    waiter = session("signup-api-replica", autocommit=False)
    blocked = threading.Thread(
        target=waiter.execute,
        args=("SELECT pg_advisory_xact_lock(hashtextextended('signup:an@example.com', 0))",),
    )
    blocked.start()
    try:
        scrape = exporter.scrape_until(
            lambda s: (
                s.find("pg_advisory_waiters", **_labels("signup-api-replica"))
                == [(_labels("signup-api-replica"), 1.0)]
                and s.value("pg_advisory_wait_max_seconds", **_labels("signup-api-replica")) > 0.3
            )
        )
        waiting = _labels("signup-api-replica")
        assert scrape.value("pg_advisory_locks", **waiting, mode="exclusive", granted="false") == 1
        assert scrape.find("pg_advisory_holders", **waiting) == []
        assert scrape.value("pg_advisory_waiters", **_labels("signup-api")) == 0
        assert scrape.value("pg_advisory_wait_max_seconds", **_labels("signup-api")) == 0
    finally:
        holder.commit()
        blocked.join(timeout=10)
        waiter.commit()
    after = exporter.scrape()
    assert after.find("pg_advisory_waiters", **_labels("signup-api-replica")) == []


def test_transaction_lock_held_idle_in_transaction(
    exporter: RunningExporter, session: Session
) -> None:
    conn = session("nightly-report", autocommit=False)
    conn.execute("SELECT pg_advisory_xact_lock(2001, 81234)")
    app = _labels("nightly-report")
    scrape = exporter.scrape_until(
        lambda s: _age_at_least(s, 0.5, **app, state="idle_in_transaction"), timeout=10
    )
    assert scrape.value("pg_advisory_holders", **app, state="idle_in_transaction") == 1
    assert (
        scrape.value("pg_advisory_idle_holder_max_seconds", **app, state="idle_in_transaction")
        >= 0.5
    )
    conn.rollback()
    assert exporter.scrape().find("pg_advisory_holders", **app) == []


def test_shared_and_exclusive_modes(exporter: RunningExporter, session: Session) -> None:
    for _ in range(2):
        session("report-reader").execute("SELECT pg_advisory_lock_shared(2001, 81234)")
    session("report-reader").execute("SELECT pg_advisory_lock(2001, 99)")
    scrape = exporter.scrape()
    app = _labels("report-reader")
    assert scrape.value("pg_advisory_locks", **app, mode="share", granted="true") == 2
    assert scrape.value("pg_advisory_locks", **app, mode="exclusive", granted="true") == 1
    assert scrape.value("pg_advisory_holders", **app, state="idle") == 3
    assert scrape.value("pg_advisory_backend_locks_max", **app) == 1


def test_reentrant_lock_is_one_entry(exporter: RunningExporter, session: Session) -> None:
    conn = session("reentrant")
    for _ in range(3):
        conn.execute("SELECT pg_advisory_lock(42)")
    scrape = exporter.scrape()
    app = _labels("reentrant")
    assert scrape.value("pg_advisory_locks", **app, mode="exclusive", granted="true") == 1
    assert scrape.value("pg_advisory_backend_locks_max", **app) == 1


def test_negative_bigint_and_int_pair_keys_are_counted_and_reported(
    exporter: RunningExporter, session: Session, monitor_dsn: str, cli: Cli
) -> None:
    conn = session("odd-keys")
    conn.execute("SELECT pg_advisory_lock(-6110350855857795459)")
    other = session("odd-keys-pair")
    other.execute("SELECT pg_advisory_lock(-5, 7)")
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_locks", **_labels("odd-keys"), mode="exclusive") == 1
    assert scrape.value("pg_advisory_locks", **_labels("odd-keys-pair"), mode="exclusive") == 1

    report = cli("check", "--dsn", monitor_dsn, check=True).stdout
    # Rows of the holders table start with the backend's pid.
    holders = {
        line.split()[2]: line
        for line in report_section(report, "Holders (").splitlines()
        if "'odd-keys" in line and line.split()[0].isdigit()
    }
    assert "-6110350855857795459" in holders["'odd-keys'"]
    assert "(-5, 7)" in holders["'odd-keys-pair'"]
    assert all(line.rstrip().endswith("session") for line in holders.values())


def test_lock_in_a_second_database_has_its_own_datname(
    exporter: RunningExporter, session: Session
) -> None:
    session("leader-elector", dbname="billing").execute("SELECT pg_advisory_lock(42)")
    session("leader-elector").execute("SELECT pg_advisory_lock(42)")  # same key, other database
    scrape = exporter.scrape()
    for datname in ("billing", "postgres"):
        app = _labels("leader-elector", datname)
        assert scrape.value("pg_advisory_locks", **app, mode="exclusive", granted="true") == 1
    assert scrape.find("pg_advisory_deadlocks_total", target="main", datname="billing")


def test_lock_table_counts_other_backends_and_never_the_exporter(
    exporter: RunningExporter, session: Session, pg: EmbeddedPostgres
) -> None:
    for i in range(3):
        session(f"bulk-import-{i}").execute(
            "SELECT count(pg_advisory_lock(%s, k)) FROM generate_series(1, 300) AS k", (i,)
        )
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_lock_table_entries", target="main") == 900
    assert scrape.value("pg_advisory_lock_table_backend_entries_max", target="main") == 300
    assert "pg-advisory-exporter" not in scrape.label_values("application_name")

    # One connection, reused: the same backend serves every collection.
    [before] = exporter_sessions(pg)
    exporter.scrape()
    exporter.scrape()
    assert exporter_sessions(pg) == [before]


def test_hostile_application_names_keep_the_exposition_valid(
    exporter: RunningExporter, session: Session, pg: EmbeddedPostgres
) -> None:
    hostile = [
        'quote"d',
        "back\\slash",
        "new\nline",
        "caf\u00e9 \u2603",
        "x" * 80,  # PostgreSQL keeps 63 bytes
        "",
    ]
    pids = []
    for name in hostile:
        conn = session("placeholder")
        conn.execute("SELECT set_config('application_name', %s, false)", (name,))
        conn.execute("SELECT pg_advisory_lock(777000 + pg_backend_pid())")
        pids.append(conn.info.backend_pid)
    with pg.connect() as conn:
        stored = [
            row[0]
            for row in conn.execute(
                "SELECT application_name FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            )
        ]
    scrape = exporter.scrape()  # parsing it is part of the assertion
    for name in stored:
        assert scrape.value("pg_advisory_holders", **_labels(name), state="idle") >= 1
    assert "x" * 63 in scrape.label_values("application_name")


def test_scrapes_close_together_share_one_read_of_pg_locks(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
) -> None:
    exporter = start_exporter(config=one_target(monitor_dsn, min_interval="30s"))
    logged = LoggedReads(pg)
    results: list[Scrape] = []
    threads = [
        threading.Thread(target=lambda: results.append(exporter.scrape())) for _ in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in range(5):
        results.append(exporter.scrape())
    assert len(results) == 17
    assert {r.value("pg_advisory_up", target="main") for r in results} == {1.0}
    reads = logged.count()
    assert reads == 1, f"the database saw {reads} collections for 17 scrapes"
