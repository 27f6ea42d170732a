"""The web configuration's rate_limit: exporter-toolkit's token bucket (one for the whole
exporter, every endpoint but liveness), its arithmetic on a clock the test moves, through
the guard in this process, and through the real exporter under a flood."""

from __future__ import annotations

import re
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from support import REFUSED_DSN, Clock, RunningExporter, StartExporter

from pg_advisory_exporter.http.rate_limit import TokenBucket
from pg_advisory_exporter.http.web_access import WebAccess
from pg_advisory_exporter.http.web_config import read_web_config
from pg_advisory_exporter.metrics import families

# Long enough that no token comes back during a test: what it sees is the burst alone.
HOUR = "rate_limit:\n  interval: 1h\n  burst: {burst}\n"
REFUSED = "pg_advisory_exporter_web_rate_limited_total"
HASH = bcrypt.hashpw(b"scrape-pw", bcrypt.gensalt(4)).decode()


def test_a_full_bucket_lets_a_burst_through_then_one_per_interval() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 3, clock)
    assert [bucket.take() for _ in range(3)] == [None, None, None]
    assert bucket.take() == pytest.approx(10.0)  # the wait until the next token
    clock.now += 4
    assert bucket.take() == pytest.approx(6.0)  # a refusal takes nothing
    clock.now += 6
    assert bucket.take() is None
    assert bucket.take() == pytest.approx(10.0)


def test_an_idle_bucket_fills_to_its_burst_and_no_further() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, 2, clock)
    bucket.take()
    bucket.take()
    clock.now += 3600
    assert [bucket.take() for _ in range(3)] == [None, None, pytest.approx(1.0)]


def test_a_clock_that_goes_back_gives_nothing_back() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, 1, clock)
    bucket.take()
    clock.now -= 100
    assert bucket.take() == pytest.approx(1.0)
    clock.now += 1
    assert bucket.take() is None


def test_a_reloaded_limit_keeps_the_tokens_left_and_hands_out_no_new_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(60.0, 5, clock)
    for _ in range(4):
        bucket.take()
    assert bucket.retuned(60.0, 5) is bucket  # the same limit: the same bucket
    wider = bucket.retuned(1.0, 100)
    assert wider.take() is None  # the one token left
    assert wider.take() == pytest.approx(1.0)  # and the new interval
    narrower = TokenBucket(1.0, 10, clock).retuned(1.0, 2)
    assert [narrower.take() for _ in range(3)] == [None, None, pytest.approx(1.0)]


def _app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


def _call(access: WebAccess, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    answered: list[tuple[str, dict[str, str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> None:
        answered.append((status, dict(headers)))

    body = b"".join(
        access.guard(_app)({"PATH_INFO": path, "REQUEST_METHOD": method}, start_response)
    )
    [(status, headers)] = answered
    return status, headers, body


def _refused(access: WebAccess) -> float:
    [family] = [f for f in families(access.samples()) if f.name == REFUSED.removesuffix("_total")]
    return family.samples[0].value


def _access(tmp_path: Path, text: str) -> tuple[Path, WebAccess]:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path, WebAccess(read_web_config(path))


def _replace(path: Path, text: str) -> None:
    """Written beside and renamed over, as the docs say: the reload sees it whole."""
    beside = path.with_suffix(".new")
    beside.write_text(text)
    beside.rename(path)


def test_past_the_burst_every_endpoint_but_liveness_gets_429_with_retry_after(
    tmp_path: Path,
) -> None:
    _, access = _access(
        tmp_path,
        HOUR.format(burst=2) + "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    )
    assert [_call(access, "/metrics")[0] for _ in range(2)] == ["200 OK"] * 2
    for path in ("/metrics", "/probe", "/locks", "/", "/health", "/-/ready", "/-/reload", "/x"):
        status, headers, body = _call(access, path)
        assert (status, body) == ("429 Too Many Requests", b"Too Many Requests\n"), path
        assert 3590 <= int(headers["Retry-After"]) <= 3600
        assert headers["X-Frame-Options"] == "deny"  # the file's headers on a refusal too
    assert _call(access, "/metrics", "HEAD")[::2] == ("429 Too Many Requests", b"")
    for _ in range(50):  # and it takes no token: the kubelet's probes never run it dry
        assert _call(access, "/-/healthy")[0] == "200 OK"
    assert _refused(access) == 9


def test_the_limit_is_one_bucket_before_the_password(tmp_path: Path) -> None:
    # As in Go: a request without the password takes a token too, and costs no bcrypt check.
    _, access = _access(
        tmp_path,
        HOUR.format(burst=1) + f"basic_auth_users:\n  prometheus: '{HASH}'\n",
    )
    assert _call(access, "/metrics")[0] == "401 Unauthorized"
    assert _call(access, "/metrics")[0] == "429 Too Many Requests"


def test_a_reload_applies_a_new_limit_and_removing_it_is_no_weakening(tmp_path: Path) -> None:
    path, access = _access(tmp_path, HOUR.format(burst=1))
    assert _call(access, "/metrics")[0] == "200 OK"
    assert _call(access, "/metrics")[0] == "429 Too Many Requests"
    _replace(path, "{}\n")  # no limit: it bounds the work, not who may read
    assert [_call(access, "/metrics")[0] for _ in range(5)] == ["200 OK"] * 5
    assert access.last_reload_successful
    _replace(path, HOUR.format(burst=3))  # a new limit, a full bucket
    assert [_call(access, "/metrics")[0][:3] for _ in range(4)] == ["200"] * 3 + ["429"]
    _replace(path, "rate_limit:\n  interval: 1h\n  burst: 100\n")  # wider: no new burst
    assert _call(access, "/metrics")[0][:3] == "429"
    _replace(path, "rate_limit:\n  interval: 1h\n  burst: 0\n")  # refused: the last one stays
    assert _call(access, "/metrics")[0][:3] == "429"
    assert not access.last_reload_successful
    assert _refused(access) == 4  # counted across reloads


def test_without_a_limit_the_counter_stays_at_zero(tmp_path: Path) -> None:
    _, access = _access(tmp_path, "")
    assert all(_call(access, "/metrics")[0] == "200 OK" for _ in range(100))
    assert _refused(access) == 0


# Through the real exporter: plain HTTP, no database (the limit is in front of everything).


def _get(exporter: RunningExporter, path: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(exporter.base + path, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def _refused_series(exporter: RunningExporter) -> float:
    status, _, body = _get(exporter, "/metrics")
    assert status == 200, body
    found = re.search(rf"^{REFUSED} (\S+)$", body, re.MULTILINE)
    assert found is not None, body
    return float(found[1])


def test_burst_plus_one_requests_the_last_gets_429_and_is_counted(
    start_exporter: StartExporter, tmp_path: Path
) -> None:
    web_file = tmp_path / "web.yml"
    web_file.write_text(HOUR.format(burst=3))
    exporter = start_exporter("--dsn", REFUSED_DSN, "--web.config.file", str(web_file))
    assert _refused_series(exporter) == 0  # the first token
    assert [_get(exporter, path)[0] for path in ("/-/ready", "/")] == [200, 200]
    status, headers, body = _get(exporter, "/metrics")
    assert (status, body) == (429, "Too Many Requests\n")
    assert 3590 <= int(headers["Retry-After"]) <= 3600
    assert [_get(exporter, p)[0] for p in ("/probe?target=x", "/locks?target=x")] == [429, 429]
    assert all(_get(exporter, "/-/healthy")[0] == 200 for _ in range(20))

    _replace(web_file, "{}\n")  # lifted at once, and the refusals stay counted
    assert _refused_series(exporter) == 3
    _replace(web_file, HOUR.format(burst=1))  # a new limit: one request, then 429
    assert [_get(exporter, "/metrics")[0] for _ in range(2)] == [200, 429]
    assert exporter.process.poll() is None


def test_a_flood_past_the_bucket_is_refused_fast_and_liveness_stays_200(
    start_exporter: StartExporter, tmp_path: Path
) -> None:
    web_file = tmp_path / "web.yml"
    web_file.write_text(HOUR.format(burst=50))
    exporter = start_exporter("--dsn", REFUSED_DSN, "--web.config.file", str(web_file))
    deadline = time.monotonic() + 3

    def flood(_: int) -> list[tuple[int, float]]:
        answers = []
        while time.monotonic() < deadline:
            started = time.monotonic()
            status = _get(exporter, "/metrics")[0]
            answers.append((status, time.monotonic() - started))
        return answers

    def liveness() -> list[tuple[int, float]]:
        answers = []
        while time.monotonic() < deadline:
            started = time.monotonic()
            answers.append((_get(exporter, "/-/healthy")[0], time.monotonic() - started))
            time.sleep(0.05)
        return answers

    with ThreadPoolExecutor(17) as pool:
        probes = pool.submit(liveness)
        flooded = [a for got in pool.map(flood, range(16)) for a in got]
        alive = probes.result()
    statuses = [status for status, _ in flooded]
    refusals = [seconds for status, seconds in flooded if status == 429]
    report = (
        f"{len(flooded)} requests in 3s: {statuses.count(200)} answered, {len(refusals)} "
        f"refused (median {statistics.median(refusals) * 1000:.1f} ms, slowest "
        f"{max(refusals) * 1000:.0f} ms); liveness {len(alive)} times, slowest "
        f"{max(s for _, s in alive) * 1000:.0f} ms"
    )
    print(report)
    assert statuses.count(200) == 50, report  # the burst, and not one more
    assert set(statuses) == {200, 429}, report
    assert {status for status, _ in alive} == {200}, report
    assert max(s for _, s in alive) < 1.0, report
    assert statistics.median(refusals) < 0.1, report
    _replace(web_file, "{}\n")
    assert _refused_series(exporter) == len(refusals)
    assert exporter.process.poll() is None
