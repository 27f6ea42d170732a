"""The advisory lock events in the server log: from real logs in each format, and from
records that differ from the server's by one thing each (the wording, the SQLSTATE, the
lock, the location), which must not count.

tests/server_logs/ holds the logs of throwaway servers (lc_messages = C, log_lock_waits = on,
deadlock_timeout = 100ms, max_locks_per_transaction = 10, log_destination = 'stderr,csvlog'
and jsonlog from 15) on which two sessions, app-a and app-b, ran: pg_advisory_unlock(1) and
pg_advisory_unlock_shared(2, -3), none held; a wait for pg_advisory_lock(-5) that ended after
0.4 s; a deadlock over pg_advisory_lock(1, -2) and (3, 4); pg_advisory_xact_lock on 100,000
keys in one statement; then a session named "x WARNING:  you don't own a lock of type
ExclusiveLock" unlocked a key it did not hold and raised a multi-line WARNING, and renamed
itself 100 L's and then 'café' for an unlock each; on 18 with log_error_verbosity = verbose,
that session also RAISEd a copy of the unlock warning and of a deadlock error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pg_advisory_exporter.keys.key import AdvisoryKey
from pg_advisory_exporter.serverlog.events import Event, Kind, LockTag, events
from pg_advisory_exporter.serverlog.records import Format, Record, parser

LOGS = Path(__file__).parent / "server_logs"
PREFIX = "%m [%p] %q%a %d %e "
CRAFTED = "x WARNING:  you don't own a lock of type ExclusiveLock"


def logged(name: str, fmt: Format, line_prefix: str = PREFIX) -> list[Event]:
    p = parser(fmt, line_prefix)
    found = []
    for line in (LOGS / name).read_bytes().split(b"\n")[:-1]:
        for record in p.feed(line):
            found += events(record)
    for record in p.flush():
        found += events(record)
    return found


def lock(database: int, classid: int, objid: int, objsubid: int) -> LockTag:
    return LockTag(database, classid, objid, objsubid)


def server_events(database_oid: int, seconds: tuple[float, float, float]) -> list[Event]:
    """What app-a and app-b's statements made the server log."""
    minus_five = lock(database_oid, 4294967295, 4294967291, 1)
    pair, other = lock(database_oid, 1, 4294967294, 2), lock(database_oid, 3, 4, 2)
    return [
        Event(Kind.UNLOCK_NOT_HELD, "postgres", "app-a"),
        Event(Kind.UNLOCK_NOT_HELD, "postgres", "app-a"),
        Event(Kind.LOCK_WAIT, "postgres", "app-b", minus_five),
        Event(Kind.LOCK_WAIT_ENDED, "postgres", "app-b", minus_five, seconds[0]),
        Event(Kind.LOCK_WAIT, "postgres", "app-b", pair),
        Event(Kind.LOCK_WAIT_ENDED, "postgres", "app-a", other, seconds[1]),  # the victim's
        Event(Kind.DEADLOCK, "postgres", "app-a", other),
        Event(Kind.LOCK_WAIT_ENDED, "postgres", "app-b", pair, seconds[2]),
        Event(Kind.OUT_OF_SHARED_MEMORY, "postgres", "app-a"),
    ]


def renamed(database: str, crafted: bool, names: tuple[str, ...]) -> list[Event]:
    """The unlocks of the session that renamed itself: under the crafted name too where the
    format keeps the name apart from the message."""
    apps = ((CRAFTED,) if crafted else ()) + names
    return [Event(Kind.UNLOCK_NOT_HELD, database, app) for app in apps]


L63 = "L" * 63  # application_name, truncated to NAMEDATALEN - 1


@pytest.mark.parametrize("fmt", ["stderr", "csvlog", "jsonlog"])
def test_the_events_of_a_postgresql_17_log(fmt: Format) -> None:
    ext = {"stderr": "log", "csvlog": "csv", "jsonlog": "json"}[fmt]
    expected = server_events(5, (0.400468, 0.100091, 0.40187))
    # In stderr the crafted name's lines cannot be read: its unlock is not counted.
    expected += renamed("postgres", fmt != "stderr", (L63, "caf\\xc3\\xa9"))
    assert logged(f"17.{ext}", fmt) == expected


@pytest.mark.parametrize(("fmt", "ext"), [("stderr", "log"), ("csvlog", "csv")])
def test_the_events_of_a_postgresql_14_log(fmt: Format, ext: str) -> None:
    line_prefix = "%t [%p-%l] %q%u@%d,app=%a,host=%r "
    expected = server_events(12972, (0.40058, 0.100127, 0.402001))
    # 14 writes a non-ASCII application_name's bytes as question marks.
    expected += renamed("postgres", fmt != "stderr", (L63, "caf??"))
    assert logged(f"14.{ext}", fmt, line_prefix) == expected


@pytest.mark.parametrize("fmt", ["stderr", "csvlog", "jsonlog"])
def test_a_raise_is_told_from_the_server_by_its_location(fmt: Format) -> None:
    """log_error_verbosity = verbose: the session's RAISEd copies of an unlock warning and of
    a deadlock error come from pl_exec.c, and count for nothing."""
    ext = {"stderr": "log", "csvlog": "csv", "jsonlog": "json"}[fmt]
    found = logged(f"18-verbose.{ext}", fmt)
    assert found[:9] == server_events(5, (0.400827, 0.100174, 0.402222))
    assert found[9:] == renamed("postgres", fmt != "stderr", (L63, "caf\\xc3\\xa9"))


def test_without_a_location_a_raise_reads_as_the_server() -> None:
    """What log_error_verbosity = verbose is for: a RAISE's copy, without the location that
    gives it away, is the server's report to the letter."""
    raised = Record("WARNING", "you don't own a lock of type ExclusiveLock", "01000")
    assert events(raised) == [Event(Kind.UNLOCK_NOT_HELD, None, None)]
    at_raise = Record(
        "WARNING", raised.message, "01000", location="exec_stmt_raise, pl_exec.c:3909"
    )
    assert events(at_raise) == []


def test_the_lock_tag_gives_the_key() -> None:
    assert lock(5, 4294967295, 4294967291, 1).key() == AdvisoryKey(1, (-5,))
    assert lock(5, 1, 4294967294, 2).key() == AdvisoryKey(2, (1, -2))
    assert lock(5, 0x80000000, 0, 1).key() == AdvisoryKey(1, (-(2**63),))


def waiting(description: str, verb: str = "still waiting for", after: str = "100.105") -> Record:
    message = f"process 22315 {verb} ExclusiveLock on {description} after {after} ms"
    return Record("LOG", message, None, database="db", application_name="app")


ADVISORY = "advisory lock [5,4294967295,4294967291,1]"
WAITS = f"Process 7 waits for ExclusiveLock on {ADVISORY}; blocked by process 8."


@pytest.mark.parametrize(
    ("verb", "kind"),
    [
        ("still waiting for", Kind.LOCK_WAIT),
        ("acquired", Kind.LOCK_WAIT_ENDED),
        ("failed to acquire", Kind.LOCK_WAIT_ENDED),
        ("detected deadlock while waiting for", Kind.LOCK_WAIT_ENDED),
    ],
)
def test_lock_waits(verb: str, kind: Kind) -> None:
    seconds = 1.5 if kind is Kind.LOCK_WAIT_ENDED else None
    (event,) = events(waiting(ADVISORY, verb, "1500.000"))
    assert event == Event(kind, "db", "app", lock(5, 4294967295, 4294967291, 1), seconds)


@pytest.mark.parametrize(
    ("after", "seconds"),
    [("0.000", 0.0), ("100.105", 0.100105), ("86400000.001", 86400.000001)],
)
def test_a_wait_s_logged_duration(after: str, seconds: float) -> None:
    (event,) = events(waiting(ADVISORY, "acquired", after))
    assert event.seconds == seconds


@pytest.mark.parametrize(
    "record",
    [
        # A rearranged queue: the same check then logs "still waiting" or "acquired".
        Record(
            "LOG",
            f"process 1 avoided deadlock for ExclusiveLock on {ADVISORY}"
            " by rearranging queue order after 1.000 ms",
        ),
        waiting("relation 16384 of database 5"),
        waiting("transaction 1234"),
        waiting("advisory lock [5,1,2,65536]"),  # past a tag's fourth field (uint16)
        waiting("advisory lock [5,4294967296,0,1]"),  # past an oid
        waiting("advisory lock [5,-1,0,1]"),
        waiting(f"{ADVISORY} or so"),
        waiting(ADVISORY, after="100.1"),
        waiting(ADVISORY, after="1" * 20 + ".000"),
        Record("LOG", waiting(ADVISORY).message + " "),
        Record("LOG", "x " + waiting(ADVISORY).message),
        Record("LOG", waiting(ADVISORY).message + "\nsecond line"),
        Record("WARNING", waiting(ADVISORY).message),
        Record("LOG", waiting(ADVISORY).message, "P0001"),  # RAISE LOG ... USING ERRCODE
        Record("LOG", waiting(ADVISORY).message, location="exec_stmt_raise, pl_exec.c:3909"),
        # Translated: lc_messages must be English.
        Record(
            "LOG", f"Prozess 1 wartet noch auf ExclusiveLock-Sperre auf {ADVISORY} nach 1,000 ms"
        ),
    ],
)
def test_what_is_no_advisory_lock_wait(record: Record) -> None:
    assert events(record) == []


@pytest.mark.parametrize(
    ("objsubid", "extension"), [(5, "citus"), (16, "citus"), (29749, "timescaledb"), (3, "unknown")]
)
def test_a_wait_for_an_extension_s_own_lock_is_kept(objsubid: int, extension: str) -> None:
    (event,) = events(waiting(f"advisory lock [5,1,2,{objsubid}]"))
    assert event.kind is Kind.LOCK_WAIT
    assert event.lock == lock(5, 1, 2, objsubid)
    assert lock(5, 1, 2, objsubid).extension == extension
    assert lock(5, 1, 2, 1).extension is None  # an application's key


def test_a_deadlock_over_an_extension_s_own_lock_alone_is_not_the_application_s() -> None:
    assert events(deadlock("advisory lock [5,1,2,29749]")) == []
    found = events(deadlock("advisory lock [5,1,2,7]", "advisory lock [5,0,7,1]"))
    assert found == [Event(Kind.DEADLOCK, "db", "app", lock(5, 0, 7, 1))]


def test_a_wait_logged_with_its_location() -> None:
    record = Record("LOG", waiting(ADVISORY).message, "00000", location="ProcSleep, proc.c:1647")
    assert [event.kind for event in events(record)] == [Kind.LOCK_WAIT]


def deadlock(
    *cycle: str,
    queries: tuple[str, ...] = ("select 1",),
    sqlstate: str | None = "40P01",
    location: str | None = None,
) -> Record:
    """DeadLockReport's error: a "waits for" line per process of the cycle, then its query
    lines (the log's detail only)."""
    lines = [
        f"Process {100 + i} waits for ExclusiveLock on {what}; blocked by process {101 + i}."
        for i, what in enumerate(cycle)
    ]
    lines += [f"Process {100 + i}: {query}" for i, query in enumerate(queries)]
    detail = "\n".join(lines)
    return Record("ERROR", "deadlock detected", sqlstate, detail, None, "db", "app", 7, location)


def test_a_deadlock_counts_its_first_advisory_lock() -> None:
    found = events(deadlock("relation 16384 of database 5", "advisory lock [5,0,7,1]", ADVISORY))
    assert found == [Event(Kind.DEADLOCK, "db", "app", lock(5, 0, 7, 1))]
    # Where the format has no SQLSTATE (stderr without %e), by the message alone.
    assert events(deadlock(ADVISORY, sqlstate=None))[0].kind is Kind.DEADLOCK


@pytest.mark.parametrize(
    "record",
    [
        deadlock("relation 16384 of database 5", "transaction 1234"),
        # A query, in the log's detail, that names an advisory lock: no lock of the cycle.
        deadlock("relation 16384 of database 5", queries=(f"select '{WAITS}'",)),
        deadlock("relation 16384 of database 5", queries=(f"select '\n{WAITS}'",)),
        deadlock(ADVISORY, sqlstate="P0001"),
        Record("ERROR", "deadlock detected", "40P01"),
        Record("ERROR", "deadlock detected!", "40P01", detail=deadlock(ADVISORY).detail),
        Record("LOG", "deadlock detected", "40P01", detail=deadlock(ADVISORY).detail),
        deadlock(ADVISORY, location="exec_stmt_raise, pl_exec.c:3909"),
    ],
)
def test_what_is_no_advisory_deadlock(record: Record) -> None:
    assert events(record) == []


def test_a_deadlock_with_its_location() -> None:
    record = deadlock(ADVISORY, location="DeadLockReport, deadlock.c:1133")
    assert [event.kind for event in events(record)] == [Kind.DEADLOCK]


# The lock table full, as each version hints it.
HINTS = [
    "You might need to increase max_locks_per_transaction.",  # 14, 15, 16
    'You might need to increase "max_locks_per_transaction".',  # 17, 18
    "Sie müssen möglicherweise max_locks_per_transaction erhöhen.",  # de, 15
    "max_locks_per_transactionを増やす必要があるかもしれません",  # ja, 15
]


@pytest.mark.parametrize("hint", HINTS)
def test_the_lock_table_full(hint: str) -> None:
    english = Record("ERROR", "out of shared memory", "53200", hint=hint, database="db")
    assert events(english) == [Event(Kind.OUT_OF_SHARED_MEMORY, "db", None)]
    # The message is translated; the SQLSTATE and the setting's name are not.
    translated = Record("FEHLER", "Shared Memory aufgebraucht", "53200", hint=hint)
    assert [event.kind for event in events(translated)] == [Kind.OUT_OF_SHARED_MEMORY]


def test_the_lock_table_full_without_a_sqlstate_is_read_in_english() -> None:
    hint = HINTS[0]
    assert (
        events(Record("ERROR", "out of shared memory", hint=hint))[0].kind
        is Kind.OUT_OF_SHARED_MEMORY
    )
    # During a backend's start an ERROR is promoted to FATAL.
    assert (
        events(Record("FATAL", "out of shared memory", hint=hint))[0].kind
        is Kind.OUT_OF_SHARED_MEMORY
    )
    assert events(Record("ERROR", "Shared Memory aufgebraucht", hint=hint)) == []
    assert events(Record("LOG", "out of shared memory", hint=hint)) == []


@pytest.mark.parametrize(
    "record",
    [
        # The predicate lock table's: its hint names max_pred_locks_per_transaction.
        Record(
            "ERROR",
            "out of shared memory",
            "53200",
            hint="You might need to increase max_pred_locks_per_transaction.",
        ),
        Record(
            "ERROR",
            "out of shared memory",
            "53200",
            hint='You might need to increase "max_pred_locks_per_transaction".',
        ),
        Record(
            "ERROR",
            "out of shared memory",
            hint="You might need to increase max_pred_locks_per_transaction.",
        ),
        Record("ERROR", "out of shared memory", "53200"),
        Record(
            "ERROR",
            "out of shared memory",
            "53200",
            hint="Increase my_max_locks_per_transaction_x.",
        ),
        Record("ERROR", "out of memory", "53200", hint="Failed on request of size 1."),
        Record("ERROR", "out of shared memory", "XX000", hint=HINTS[0]),
        Record(
            "ERROR",
            "out of shared memory",
            "53200",
            hint=HINTS[0],
            location="exec_stmt_raise, pl_exec.c:3909",
        ),
    ],
)
def test_what_is_not_the_lock_table_full(record: Record) -> None:
    assert events(record) == []


def test_the_lock_table_full_with_its_location() -> None:
    record = Record(
        "ERROR",
        "out of shared memory",
        "53200",
        hint=HINTS[1],
        location="LockAcquireExtended, lock.c:1077",
    )
    assert [event.kind for event in events(record)] == [Kind.OUT_OF_SHARED_MEMORY]


@pytest.mark.parametrize(
    "record",
    [
        Record("WARNING", "you don't own a lock of type ExclusiveLock", "01000"),
        Record("WARNING", "you don't own a lock of type ShareLock", "01000"),
        Record("WARNING", "you don't own a lock of type ShareLock"),  # stderr without %e
        Record("WARNUNG", "you don't own a lock of type ShareLock", "01000"),  # elog: English
        Record(
            "WARNING", "you don't own a lock of type ShareLock", location="LockRelease, lock.c:2110"
        ),
    ],
)
def test_an_unlock_of_a_lock_not_held(record: Record) -> None:
    assert [event.kind for event in events(record)] == [Kind.UNLOCK_NOT_HELD]


@pytest.mark.parametrize(
    "record",
    [
        Record("WARNING", "you don't own a lock of type AccessExclusiveLock", "01000"),
        Record("WARNING", "you don't own a lock of type ShareLock.", "01000"),
        Record("WARNING", "you don't own a lock of type ShareLock", "P0001"),
        Record("LOG", "you don't own a lock of type ShareLock"),
        Record("WARNING", f"{CRAFTED} postgres LOG:  statement: select 1"),
        Record(
            "WARNING",
            "you don't own a lock of type ShareLock",
            location="exec_stmt_raise, pl_exec.c:3909",
        ),
        Record("WARNING", "you don't own a lock of type ShareLock", location="somewhere"),
    ],
)
def test_what_is_no_unlock_of_a_lock_not_held(record: Record) -> None:
    assert events(record) == []


def test_a_crafted_application_name_in_stderr_makes_no_event() -> None:
    """The prefix `%m [%p] %a %d ` and an application_name that reads as the end of a
    prefix and a lock message, on the session's every line."""
    p = parser("stderr", "%m [%p] %a %d ")
    lines = [
        f"2026-12-01 23:37:04.689 UTC [11928] {CRAFTED} postgres LOG:  statement: select 1",
        f"2026-12-01 23:37:04.689 UTC [11928] {CRAFTED} postgres LOG:  connection authorized: user=x",  # noqa: E501
    ]
    found = [
        event for line in lines for record in p.feed(line.encode()) for event in events(record)
    ]
    assert found + [event for record in p.flush() for event in events(record)] == []
    assert p.unparsed == 2


# 15.18 with lc_messages = 'de_DE.UTF-8' (15-de.*), and an out of shared memory in a LATIN1
# database whose statement ends with `-- café`, byte 0xE9 in every format (15-latin1.*); the
# sessions "unlocker" and "filler", the prefix SUITE_PREFIX.
SUITE_PREFIX = "%m [%p] %q%e %u@%d %a "


@pytest.mark.parametrize(("fmt", "ext"), [("csvlog", "csv"), ("jsonlog", "json")])
def test_a_translated_server_is_read_by_sqlstate(fmt: Format, ext: str) -> None:
    assert logged(f"15-de.{ext}", fmt, SUITE_PREFIX) == [
        Event(Kind.UNLOCK_NOT_HELD, "postgres", "unlocker"),
        Event(Kind.OUT_OF_SHARED_MEMORY, "postgres", "filler"),
    ]


def test_a_translated_servers_stderr_is_not_read() -> None:
    """Its severities are translated too (WARNUNG, FEHLER): no line is a record, and each
    counts as unparsed, which pg_advisory_log_unparsed_lines_total shows."""
    p = parser("stderr", SUITE_PREFIX)
    lines = (LOGS / "15-de.log").read_bytes().split(b"\n")[:-1]
    assert [r for line in lines for r in p.feed(line)] + p.flush() == []
    assert p.unparsed == len(lines)


@pytest.mark.parametrize(
    ("fmt", "ext"), [("stderr", "log"), ("csvlog", "csv"), ("jsonlog", "json")]
)
def test_a_latin1_databases_bytes_lose_nothing(fmt: Format, ext: str) -> None:
    assert logged(f"15-latin1.{ext}", fmt, SUITE_PREFIX) == [
        Event(Kind.OUT_OF_SHARED_MEMORY, "latin1", "filler")
    ]
