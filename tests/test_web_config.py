"""The web configuration file: exporter-toolkit's format, checked as promtool checks it, and
the fields of a newer exporter-toolkit than promtool's (inline certificates, client SANs, the
rate limit) by that toolkit's documented rules."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from cryptography.hazmat.primitives import serialization
from support import Tls

from pg_advisory_exporter.http.web_config import read_web_config
from pg_advisory_exporter.http.web_config_file import CIPHER_SUITES, MAX_INLINE_PEM, TlsServerConfig
from pg_advisory_exporter.validation import ConfigError

HASH = bcrypt.hashpw(b"scrape-pw", bcrypt.gensalt(4)).decode()
TLS = "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n"

# Files that promtool and the exporter must judge alike: (name, text, accepted). Paths are
# relative to the file, which sits beside the certificates of the `tls` fixture.
AGREEMENT = [
    ("empty", "", True),
    ("empty mapping", "{}\n", True),
    ("tls", TLS, True),
    ("tls block without values", "tls_server_config:\n", True),
    ("users only, no tls", f"basic_auth_users:\n  prom: '{HASH}'\n", True),
    (
        "tls, users and every allowed header",
        TLS + f"basic_auth_users:\n  prom: '{HASH}'\n  grafana: '{HASH}'\n"
        "http_server_config:\n  http2: false\n  headers:\n"
        "    Strict-Transport-Security: max-age=31536000\n"
        "    X-Content-Type-Options: nosniff\n    X-Frame-Options: sameorigin\n"
        "    X-XSS-Protection: '1; mode=block'\n    Content-Security-Policy: default-src 'none'\n",
        True,
    ),
    ("versions", TLS + "  min_version: TLS13\n  max_version: TLS13\n", True),
    (
        "cipher suites",
        TLS + "  prefer_server_cipher_suites: false\n  cipher_suites:\n"
        "    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\n    - TLS_AES_128_GCM_SHA256\n",
        True,
    ),
    ("only TLS 1.3 suites", TLS + "  cipher_suites: [TLS_AES_256_GCM_SHA384]\n", True),
    (
        "client certificates required",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
        True,
    ),
    (
        "client certificates if given",
        TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n",
        True,
    ),
    ("no client certificate, said so", TLS + "  client_auth_type: NoClientCert\n", True),
    ("unknown top-level field", "tls_config:\n  cert_file: server.pem\n", False),
    ("key file missing", "tls_server_config:\n  cert_file: server.pem\n", False),
    ("cert file missing", "tls_server_config:\n  key_file: server-key.pem\n", False),
    ("only a client CA", "tls_server_config:\n  client_ca_file: ca.pem\n", False),
    ("certificate not found", "tls_server_config:\n  cert_file: nope.pem\n  key_file: x\n", False),
    (
        "key of another certificate",
        "tls_server_config:\n  cert_file: server.pem\n  key_file: client.pem\n",
        False,
    ),
    ("insecure cipher", TLS + "  cipher_suites: [TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA]\n", False),
    ("unknown version", TLS + "  min_version: TLS14\n", False),
    ("unknown client auth", TLS + "  client_auth_type: Always\n", False),
    ("client CA without a policy", TLS + "  client_ca_file: ca.pem\n", False),
    ("header not allowed", "http_server_config:\n  headers:\n    Server: nginx\n", False),
    ("header value", "http_server_config:\n  headers:\n    X-Frame-Options: allow\n", False),
    ("plain-text password", "basic_auth_users:\n  prom: scrape-pw\n", False),
    ("bcrypt cost 3", f"basic_auth_users:\n  prom: '$2b$03${HASH[7:]}'\n", False),
    ("duplicate user", f"basic_auth_users:\n  prom: '{HASH}'\n  prom: '{HASH}'\n", False),
    ("a list", "- tls_server_config\n", False),
    ("not YAML", "tls_server_config: [\n", False),
]

# What Go can do and Python's ssl cannot: promtool accepts these, the exporter refuses them
# and names the key, rather than start with less protection than the file asks for.
BEYOND_PYTHON = [
    ("curve_preferences", TLS + "  curve_preferences: [X25519]\n"),
    (
        "client_auth_type",
        TLS + "  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.pem\n",
    ),
    ("client_auth_type", TLS + "  client_auth_type: RequestClientCert\n"),
]


def _write(tls: Tls, text: str) -> Path:
    path = tls.folder / "web.yml"
    path.write_text(text)
    return path


def _exporter_accepts(path: Path) -> bool:
    try:
        read_web_config(path)
    except ConfigError:
        return False
    return True


def _promtool_accepts(promtool: str, path: Path) -> tuple[bool, str]:
    checked = subprocess.run(
        [promtool, "check", "web-config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("text", "accepted"), [c[1:] for c in AGREEMENT], ids=[c[0] for c in AGREEMENT]
)
def test_promtool_and_the_exporter_agree(
    promtool: str, tls: Tls, text: str, accepted: bool
) -> None:
    path = _write(tls, text)
    promtool_accepts, said = _promtool_accepts(promtool, path)
    assert promtool_accepts is accepted, said  # the case means what it says
    assert _exporter_accepts(path) is accepted


@pytest.mark.parametrize(
    ("key", "text"), BEYOND_PYTHON, ids=[c[1].split()[-1] for c in BEYOND_PYTHON]
)
def test_what_python_cannot_honour_is_refused_by_name(
    promtool: str, tls: Tls, key: str, text: str
) -> None:
    path = _write(tls, text)
    assert _promtool_accepts(promtool, path)[0]
    with pytest.raises(ConfigError, match=rf"^{path}: tls_server_config\.{key}: .*not supported"):
        read_web_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TLS + "  min_version: TLS14\n", "tls_server_config.min_version: unknown TLS version"),
        ("tls_server_config:\n  cert_file: server.pem\n", "tls_server_config: missing key_file"),
        (TLS + "  cipher_suites: [RC4]\n", "tls_server_config.cipher_suites: unknown cipher: RC4"),
        ("basic_auth_users:\n  prom: scrape-pw\n", "basic_auth_users.prom: not a bcrypt hash"),
        ("http_server_config:\n  headers:\n    Server: x\n", "http_server_config.headers: HTTP"),
        ("tls_server_config:\n  cert_file: nope.pem\n  key_file: k\n", ".cert_file: cannot load"),
        ("tls_config: {}\n", "tls_config: unknown field"),
    ],
)
def test_an_error_names_the_file_and_the_key(tls: Tls, text: str, message: str) -> None:
    path = _write(tls, text)
    with pytest.raises(ConfigError) as error:
        read_web_config(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


def test_a_password_given_instead_of_a_hash_is_never_repeated(tls: Tls) -> None:
    with pytest.raises(ConfigError) as error:
        read_web_config(_write(tls, "basic_auth_users:\n  prom: my-Secret-pw\n"))
    assert "my-Secret-pw" not in str(error.value)
    assert "htpasswd" in str(error.value)  # and it says how to make a hash


def test_paths_are_relative_to_the_file_and_settings_take_effect(tls: Tls) -> None:
    text = (
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n"
        "  min_version: TLS13\n"
        f"basic_auth_users:\n  prom: '{HASH}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    )
    settings = read_web_config(_write(tls, text))
    assert settings.tls is not None
    assert settings.tls.verify_mode == ssl.CERT_REQUIRED
    assert settings.tls.minimum_version == ssl.TLSVersion.TLSv1_3
    assert settings.users == {"prom": HASH.encode()}
    assert settings.headers == (("X-Frame-Options", "deny"),)
    assert set(settings.files) == {tls.folder / "web.yml", tls.cert_file, tls.key_file, tls.ca_file}


def test_every_tls12_suite_is_one_this_openssl_offers(tls: Tls) -> None:
    # The table's OpenSSL names are real ones: each alone makes a usable context.
    for go_name, openssl_name in CIPHER_SUITES.items():
        text = TLS + f"  cipher_suites: [{go_name}]\n"
        settings = read_web_config(_write(tls, text))
        assert settings.tls is not None
        if openssl_name is not None:
            offered = {c["name"] for c in settings.tls.get_ciphers() if c["protocol"] != "TLSv1.3"}
            assert offered == {openssl_name}, go_name


# Fields of a later exporter-toolkit (inline PEM from 0.10, client_allowed_sans from 0.10,
# rate_limit from 0.15) than Debian's promtool 2.42 carries, which refuses each as unknown:
# (name, text, None if the exporter accepts it, else the located problem it must say).
# <cert>, <key> and <ca> stand for the `tls` fixture's PEM text, inline.
SANS = TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n"
NEWER_THAN_PROMTOOL: list[tuple[str, str, str | None]] = [
    ("inline cert and key", "tls_server_config:\n  cert: <cert>\n  key: <key>\n", None),
    ("inline key, cert file", "tls_server_config:\n  cert_file: server.pem\n  key: <key>\n", None),
    (
        "inline client CA",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca: <ca>\n",
        None,
    ),
    ("client SANs", SANS + "  client_allowed_sans: [prometheus@example.com, 10.0.0.1]\n", None),
    ("client SANs, null", SANS + "  client_allowed_sans:\n", None),
    ("the toolkit's sample rate limit", "rate_limit:\n  interval: 1s\n  burst: 20\n", None),
    ("rate limit off", "rate_limit:\n  interval: 0\n", None),
    ("rate limit, empty", "rate_limit:\n", None),
    ("rate limit, Go's units", "rate_limit: {interval: 1m30.5s, burst: 1}\n", None),
    (
        "inline cert and cert_file",
        "tls_server_config:\n  cert_file: server.pem\n  cert: <cert>\n  key: <key>\n",
        "tls_server_config.cert: give cert or cert_file, not both",
    ),
    (
        "inline key and key_file",
        TLS + "  key: <key>\n",
        "tls_server_config.key: give key or key_file, not both",
    ),
    (
        "inline client CA and client_ca_file",
        SANS + "  client_ca: <ca>\n",
        "tls_server_config.client_ca: give client_ca or client_ca_file, not both",
    ),
    (
        "inline key alone",
        "tls_server_config:\n  key: <key>\n",
        "tls_server_config: missing cert_file (or cert, inline)",
    ),
    (
        "inline cert, not PEM",
        "tls_server_config:\n  cert: not a certificate\n  key: <key>\n",
        "tls_server_config.cert: cannot load the certificate and key",
    ),
    (
        "inline key of another certificate",
        "tls_server_config:\n  cert: <cert>\n  key: <ca>\n",
        "tls_server_config.cert: cannot load the certificate and key",
    ),
    (
        "inline client CA, not PEM",
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca: nonsense\n",
        "tls_server_config.client_ca: cannot load",
    ),
    (
        "inline client CA without a policy",
        TLS + "  client_ca: <ca>\n",
        "tls_server_config: client_ca is set without a client_auth_type",
    ),
    (
        "client SANs, no client certificate",
        TLS + "  client_allowed_sans: [prometheus]\n",
        "tls_server_config.client_allowed_sans: needs client_auth_type: "
        "RequireAndVerifyClientCert, not none",
    ),
    (
        "client SANs, certificates if given",
        TLS + "  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n"
        "  client_allowed_sans: [prometheus]\n",
        "tls_server_config.client_allowed_sans: needs client_auth_type: "
        "RequireAndVerifyClientCert, not VerifyClientCertIfGiven",
    ),
    (
        "client SANs, empty list",
        SANS + "  client_allowed_sans: []\n",
        "tls_server_config.client_allowed_sans: an empty list admits no client",
    ),
    (
        "client SANs, not a list",
        SANS + "  client_allowed_sans: prometheus\n",
        "tls_server_config.client_allowed_sans: Input should be a valid tuple",
    ),
    (
        "burst as a string",
        "rate_limit: {interval: 1s, burst: '5'}\n",
        "rate_limit.burst: Input should be a valid integer",
    ),
    (
        "burst a fraction",
        "rate_limit: {interval: 1s, burst: 2.5}\n",
        "rate_limit.burst: Input should be a valid integer",
    ),
    ("burst 0", "rate_limit: {interval: 1s, burst: 0}\n", "rate_limit.burst: must be at least 1"),
    ("burst missing", "rate_limit: {interval: 1s}\n", "rate_limit.burst: must be at least 1"),
    (
        "burst negative",
        "rate_limit: {interval: 0s, burst: -1}\n",
        "rate_limit.burst: Input should be greater than or equal to 0",
    ),
    (
        "interval negative",
        "rate_limit: {interval: -1s, burst: 5}\n",
        "rate_limit.interval: must not be negative",
    ),
    (
        "interval without a unit",
        "rate_limit: {interval: 5, burst: 5}\n",
        "rate_limit.interval: 5 has no unit, which Go reads as nanoseconds",
    ),
    (
        "interval in Prometheus' days",
        "rate_limit: {interval: 1d, burst: 5}\n",
        "rate_limit.interval: '1d' is not a duration",
    ),
    (
        "interval past Go's longest",
        "rate_limit: {interval: 3000000h, burst: 5}\n",
        "rate_limit.interval: '3000000h' is longer than Go's longest duration",
    ),
    ("rate limit, unknown field", "rate_limit: {rate: 5}\n", "rate_limit.rate: unknown field"),
    ("rate limit, a list", "rate_limit: [1s, 5]\n", "rate_limit: Input should be"),
]


def _block(pem: str) -> str:
    """PEM text as a YAML block scalar under a key indented by two."""
    return "|\n" + "".join(f"    {line}\n" for line in pem.strip().splitlines())


def _inline_pems(tls: Tls, text: str) -> str:
    """`text` with <cert>, <key> and <ca> replaced by the `tls` fixture's PEM, inline."""
    for placeholder, path in (
        ("<cert>", tls.cert_file),
        ("<key>", tls.key_file),
        ("<ca>", tls.ca_file),
    ):
        text = text.replace(placeholder, _block(path.read_text()))
    return text


@pytest.mark.parametrize(
    ("text", "problem"),
    [c[1:] for c in NEWER_THAN_PROMTOOL],
    ids=[c[0] for c in NEWER_THAN_PROMTOOL],
)
def test_fields_newer_than_promtool_follow_exporter_toolkits_rules(
    promtool: str, tls: Tls, text: str, problem: str | None
) -> None:
    path = _write(tls, _inline_pems(tls, text))
    accepted, said = _promtool_accepts(promtool, path)
    assert not accepted, said
    assert "not found in type" in said  # its toolkit is older: the field itself is unknown
    if problem is None:
        assert _exporter_accepts(path)
        return
    with pytest.raises(ConfigError) as error:
        read_web_config(path)
    assert str(error.value).startswith(f"{path}: {problem}"), str(error.value)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bytes:
    """A TLS handshake over a socket pair (no network), and a byte the server sends after it;
    the server's certificate, DER."""
    near, far = socket.socketpair()
    served: list[object] = []

    def serve() -> None:
        try:
            with server.wrap_socket(far, server_side=True) as conn:
                conn.sendall(b"!")
        except OSError as exc:
            served.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(near, server_hostname="127.0.0.1") as conn:
            certificate = conn.getpeercert(binary_form=True)
            # In TLS 1.3 the client's handshake ends first: a refusal comes after it.
            assert conn.recv(1) == b"!"
    finally:
        thread.join(10)
        far.close()
    assert certificate is not None, served
    return certificate


def test_inline_certificate_key_and_client_ca_serve_a_client_certificate(tls: Tls) -> None:
    text = (
        f"tls_server_config:\n  cert: {_block(tls.cert_file.read_text())}"
        f"  key: {_block(tls.key_file.read_text())}"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca: {_block(tls.ca_file.read_text())}"
    )
    settings = read_web_config(_write(tls, text))
    assert settings.tls is not None
    assert settings.files == (tls.folder / "web.yml",)  # the text is in the file: it reloads
    served = _handshake(settings.tls, tls.client(certificate=True))
    assert served == ssl.PEM_cert_to_DER_cert(tls.cert_file.read_text())
    with pytest.raises(ssl.SSLError):  # the inline client CA is what verifies the client
        _handshake(settings.tls, tls.client(certificate=False))


def _inline_key_file(tls: Tls) -> Path:
    return _write(
        tls,
        f"tls_server_config:\n  cert_file: server.pem\n  key: {_block(tls.key_file.read_text())}",
    )


def test_an_inline_key_is_read_from_memory_never_from_a_disk(
    tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    load = ssl.SSLContext.load_cert_chain

    def recording(context: ssl.SSLContext, certfile: str, keyfile: str, **kwargs: Any) -> None:
        opened.append(keyfile)
        load(context, certfile, keyfile, **kwargs)

    def no_disk(*args: object, **kwargs: object) -> str:
        raise AssertionError("a temporary folder was made")

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", recording)
    monkeypatch.setattr(tempfile, "mkdtemp", no_disk)
    descriptors = len(os.listdir("/proc/self/fd"))
    assert read_web_config(_inline_key_file(tls)).tls is not None
    [keyfile] = opened
    assert keyfile.startswith("/proc/self/fd/")
    assert len(os.listdir("/proc/self/fd")) == descriptors  # the memfd is closed after


def test_without_a_memfd_the_key_is_in_a_private_file_removed_after_loading(
    tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Path, int, int]] = []
    load = ssl.SSLContext.load_cert_chain

    def recording(context: ssl.SSLContext, certfile: str, keyfile: str, **kwargs: Any) -> None:
        key = Path(keyfile)
        seen.append((key, key.stat().st_mode & 0o777, key.parent.stat().st_mode & 0o777))
        load(context, certfile, keyfile, **kwargs)

    def no_memfd(*args: object) -> int:
        raise OSError("memfd_create: not here")

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", recording)
    monkeypatch.setattr(os, "memfd_create", no_memfd)
    assert read_web_config(_inline_key_file(tls)).tls is not None
    [(key, mode, folder_mode)] = seen
    assert (mode, folder_mode) == (0o600, 0o700)
    assert not key.exists()
    assert not key.parent.exists()


def test_an_encrypted_key_is_refused_rather_than_asked_for_on_a_terminal(tls: Tls) -> None:
    key = serialization.load_pem_private_key(tls.key_file.read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    (tls.folder / "encrypted.pem").write_bytes(encrypted)
    path = _write(tls, "tls_server_config:\n  cert_file: server.pem\n  key_file: encrypted.pem\n")
    with pytest.raises(ConfigError, match=r"tls_server_config\.cert_file: the key is encrypted"):
        read_web_config(path)


@pytest.mark.parametrize(
    "text",
    [
        "tls_server_config:\n  cert_file: server.pem\n  key: |\n"
        "    -----BEGIN PRIVATE KEY-----\n    S3CRET-MARKER\n    -----END PRIVATE KEY-----\n",
        TLS + "  key: S3CRET-MARKER\n",
        "tls_server_config:\n  cert: S3CRET-MARKER\n  key: S3CRET-MARKER\n",
        "tls_server_config:\n  cert_file: server.pem\n  key: [S3CRET-MARKER]\n",
        "tls_server_config:\n  cert_file: server.pem\n  key: {S3CRET-MARKER: 1}\n",
    ],
    ids=["not a key", "with key_file", "neither PEM", "a list", "a mapping"],
)
def test_an_inline_key_is_never_repeated_in_an_error(tls: Tls, text: str) -> None:
    with pytest.raises(ConfigError) as error:
        read_web_config(_write(tls, text))
    assert "S3CRET" not in str(error.value)
    assert str(error.value).startswith(f"{tls.folder / 'web.yml'}: tls_server_config")


def test_an_inline_key_is_hidden_from_the_model_s_repr() -> None:
    config = TlsServerConfig.model_validate({"cert": "x", "key": "S3CRET-MARKER"})
    assert "S3CRET" not in repr(config)
    assert "S3CRET" not in str(config.model_dump())


def test_inline_text_longer_than_any_bundle_is_refused_at_once(tls: Tls) -> None:
    huge = "A" * (MAX_INLINE_PEM + 1)
    path = _write(tls, f"tls_server_config:\n  cert_file: server.pem\n  key: {huge}\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"tls_server_config\.key: longer than 1024 KiB"):
        read_web_config(path)
    assert time.monotonic() - started < 2


def test_an_alias_bomb_in_the_allowed_sans_is_refused_before_it_expands(tls: Tls) -> None:
    levels = ["&l0 [a, a, a, a, a, a, a, a, a, a]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 8)]
    path = _write(tls, SANS + f"  client_allowed_sans: [{', '.join(levels)}]\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="aliases expand"):
        read_web_config(path)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    ("interval", "seconds"),
    [("1s", 1.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("500ms", 0.5), (".5s", 0.5),
     ("1.s", 1.0), ("+2s", 2.0), ("1h2m3s4ms", 3723.004), ("10us", 1e-5), ("10µs", 1e-5),
     ("1s1s", 2.0), ("0", None), ("-0s", None)],
)  # fmt: skip
def test_rate_limit_intervals_are_go_durations(
    tls: Tls, interval: str, seconds: float | None
) -> None:
    settings = read_web_config(_write(tls, f"rate_limit:\n  interval: '{interval}'\n  burst: 3\n"))
    if seconds is None:
        assert settings.rate_limit is None
    else:
        assert settings.rate_limit is not None
        assert settings.rate_limit[0] == pytest.approx(seconds)
        assert settings.rate_limit[1] == 3


@pytest.mark.parametrize("interval", ["1", "s", ".s", "1 s", "", "1S", "1m-1s", "1.5.5s"])
def test_what_go_cannot_parse_is_not_an_interval(tls: Tls, interval: str) -> None:
    path = _write(tls, f"rate_limit:\n  interval: '{interval}'\n  burst: 3\n")
    with pytest.raises(ConfigError, match=r"rate_limit\.interval: .* is not a duration"):
        read_web_config(path)


def test_the_summary_says_the_sans_and_the_rate_limit(tls: Tls) -> None:
    text = SANS + "  client_allowed_sans: [a, b]\nrate_limit: {interval: 1m, burst: 20}\n"
    assert read_web_config(_write(tls, text)).summary == (
        "TLS on, client certificates required with one of 2 allowed SAN(s), "
        "0 basic auth user(s), 0 header(s), rate limit of 20 request(s) then one per 60s"
    )
