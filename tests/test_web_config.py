"""The web configuration file: exporter-toolkit's format, checked as promtool checks it."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import bcrypt
import pytest
from support import Tls

from pg_advisory_exporter.http.web_config import CIPHER_SUITES, read_web_config
from pg_advisory_exporter.schema import ConfigError

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
    ("a later toolkit's field", TLS + "  client_allowed_sans: [prometheus]\n", False),
    ("inline certificate", "tls_server_config:\n  cert: '-----BEGIN'\n", False),
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
