"""Durations read and written as Prometheus reads and writes them (prometheus/common's
model.ParseDuration and Duration.String()), with seconds as a number besides; promtool's own
reading agrees."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pg_advisory_exporter.durations import (
    DURATION_PATTERN,
    format_duration,
    parse_duration,
    prometheus_milliseconds,
)

# Prometheus' units in milliseconds, largest first, as its model/time.go has them; written
# here again so that the tests do not take the code's word for them.
UNITS = {
    "y": 365 * 24 * 3600 * 1000,
    "w": 7 * 24 * 3600 * 1000,
    "d": 24 * 3600 * 1000,
    "h": 3600 * 1000,
    "m": 60 * 1000,
    "s": 1000,
    "ms": 1,
}
PROMETHEUS_DURATION = re.compile("".join(f"([0-9]+{unit})?" for unit in UNITS))
# Go's time.Duration: nanoseconds in an int64.
LONGEST_MS = (2**63 - 1) // 10**6
MILLISECONDS = st.integers(min_value=0, max_value=10**12)


@st.composite
def prometheus_texts(draw: st.DrawFn) -> tuple[str, int]:
    """A duration in Prometheus' grammar (some units, largest first, each once) and its
    milliseconds."""
    units = draw(st.lists(st.sampled_from(list(UNITS)), min_size=1, unique=True))
    text, milliseconds = "", 0
    for unit in sorted(units, key=list(UNITS).index):
        count = draw(st.integers(min_value=0, max_value=200))  # 200y and more: within 292y
        text += f"{count}{unit}"
        milliseconds += count * UNITS[unit]
    return text, milliseconds


def _read(text: str) -> float:
    seconds = parse_duration(text)
    assert isinstance(seconds, float)
    return seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(900, "15m"), (90, "1m30s"), (0.5, "500ms"), (1.5, "1s500ms"), (0, "0s"),
     (86400 + 61, "1d1m1s"), (3725.4, "1h2m5s400ms"), (0.0004, "0s"), (0.0015, "2ms"),
     (7 * 86400, "1w"), (14 * 86400, "2w"), (10 * 86400, "10d"), (90 * 86400, "90d"),
     (365 * 86400, "1y"), (371 * 86400, "53w"), (366 * 86400, "366d"),
     (730 * 86400, "2y"), (-90, "-1m30s")],
)  # fmt: skip
def test_durations_are_written_as_prometheus_writes_them(seconds: float, text: str) -> None:
    # Years and weeks only when whole: "90d", not "12w6d" (prometheus/common's String()).
    assert format_duration(seconds) == text


@given(MILLISECONDS)
def test_a_written_duration_reads_back(milliseconds: int) -> None:
    text = format_duration(milliseconds / 1000)
    assert PROMETHEUS_DURATION.fullmatch(text)
    assert text != ""
    assert round(_read(text) * 1000) == milliseconds
    assert prometheus_milliseconds(text) == milliseconds


@given(MILLISECONDS, st.sampled_from([1, 100, 1000, 60_000]))
def test_a_rounded_duration_is_a_multiple_of_its_resolution(milliseconds: int, step: int) -> None:
    written = round(_read(format_duration(milliseconds / 1000, step / 1000)) * 1000)
    assert written % step == 0
    assert abs(written - milliseconds) <= step / 2


@given(prometheus_texts())
def test_every_duration_of_prometheus_grammar_is_read(duration: tuple[str, int]) -> None:
    text, milliseconds = duration
    assert prometheus_milliseconds(text) == milliseconds
    assert round(_read(text) * 1000) == milliseconds
    assert prometheus_milliseconds(format_duration(milliseconds / 1000)) == milliseconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("500ms", 0.5), ("1m30s", 90), ("2h", 7200), ("1w", 7 * 86400),
     ("1y", 365 * 86400), ("1y2w3d4h5m6s7ms", 33_019_506.007), ("0", 0),
     # Seconds as a number, in text or not: the exporter's own form, kept for those who use it.
     ("30", 30), ("1.5", 1.5), (3, 3), (2.5, 2.5), (" 5s ", 5)],
)  # fmt: skip
def test_durations_are_read(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("5s1m", "'5s1m' is not a duration: m after s (the units go from the largest to the "
                 "smallest, each at most once: y w d h m s ms)"),
        ("1m1m", "'1m1m' is not a duration: m twice"),
        ("1d1w", "'1d1w' is not a duration: w after d"),
        ("1.5h", "'1.5h' is not a duration: Prometheus takes a whole number of each unit, not "
                 "1.5h (write 1h30m)"),
        ("0.0001s", "not 0.0001s"),
        ("-5s", "'-5s' is not a duration: Prometheus' durations have no sign"),
        ("+5s", "have no sign"),
        ("5sec", "'5sec' is not a duration: unknown unit 'sec' (Prometheus has y, w, d, h, m, s, "
                 "ms)"),
        ("5S", "unknown unit 'S'"),
        ("5M", "unknown unit 'M'"),
        ("1h 30m", "unknown unit 'h '"),
        ("5m3", "'5m3' is not a duration: 3 has no unit"),
        ("soon", "'soon' is not a duration (use seconds or a form like 500ms, 5s, 1m30s)"),
        ("", "'' is not a duration (use seconds"),
        ("293y", "'293y' is not a duration: longer than Prometheus' longest, "
                 "106751d23h47m16s854ms (about 292 years)"),
        (True, "True is not a duration"),
    ],
)  # fmt: skip
def test_what_prometheus_refuses_is_refused_naming_the_problem(
    text: str | bool, problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_duration(text)


def test_the_longest_duration_is_prometheus_longest() -> None:
    assert prometheus_milliseconds(f"{LONGEST_MS}ms") == LONGEST_MS
    with pytest.raises(ValueError, match="longer than Prometheus' longest"):
        prometheus_milliseconds(f"{LONGEST_MS + 1}ms")


@given(st.from_regex(DURATION_PATTERN, fullmatch=True).filter(bool))
def test_the_charts_pattern_takes_only_what_the_exporter_takes(text: str) -> None:
    # Texts the pattern takes, drawn from it (random text seldom is one): each is a duration
    # the exporter reads, or one past Prometheus' longest, which a pattern cannot count to.
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        assert "longer than Prometheus' longest" in str(exc)  # noqa: PT017
        return
    assert isinstance(seconds, int | float)
    assert seconds >= 0


@given(prometheus_texts())
def test_the_charts_pattern_takes_every_prometheus_duration(duration: tuple[str, int]) -> None:
    assert re.fullmatch(DURATION_PATTERN, duration[0])


# -- promtool's reading --------------------------------------------------------------------

# Texts that Prometheus takes or refuses, at the edges of its grammar.
PROMTOOL_TEXTS = [
    "0", "1ms", "5s", "1m30s", "1h", "1d", "1w", "1y", "1y2w3d4h5m6s7ms", "90d", "2w",
    "1000ms", "61s", "25h", "292y", f"{LONGEST_MS}ms",
    "5s1m", "1m1m", "1d1w", "1.5s", "0.5m", "-5s", "+5s", "5sec", "5S", "1M", "5m3", "1h 30m",
    "", "soon", "293y", f"{LONGEST_MS + 1}ms",
]  # fmt: skip


def _promtool_takes(promtool: str, folder: Path, interval: str, timeout: str | None) -> bool:
    """Whether `promtool check config` takes a global scrape_interval (and scrape_timeout)."""
    scrape = {"scrape_interval": interval}
    if timeout is not None:
        scrape["scrape_timeout"] = timeout
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump({"global": scrape}))  # every value quoted as text
    result = subprocess.run(
        [promtool, "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0


@pytest.mark.parametrize("text", PROMTOOL_TEXTS)
def test_promtool_reads_durations_as_the_exporter_does(
    promtool: str, tmp_path: Path, text: str
) -> None:
    try:
        milliseconds: int | None = prometheus_milliseconds(text)
    except ValueError:
        milliseconds = None
    assert _promtool_takes(promtool, tmp_path, text, None) == (milliseconds is not None)
    if milliseconds:  # Prometheus takes a scrape_interval of 0 for its default, 1m
        # The same value: a scrape_timeout may equal the interval, never exceed it.
        exactly = format_duration(milliseconds / 1000)
        assert _promtool_takes(promtool, tmp_path, text, exactly)
        if milliseconds < LONGEST_MS:
            longer = format_duration((milliseconds + 1) / 1000)
            assert not _promtool_takes(promtool, tmp_path, text, longer)
