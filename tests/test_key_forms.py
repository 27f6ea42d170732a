"""The registry's forms for keys that libraries compute (keys/derive.py): digests, CRC-32,
hashtext, per-database texts; their validation; and the worked examples of
docs/configuration.md, recomputed. tests/test_key_libraries.py runs the libraries themselves."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from support import load_yaml

from pg_advisory_exporter.keys.derive import crc32_parts, digest_parts, forms_of, template_error
from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import RegisteredKey, Registry, check_configs, expand

DOCS = Path(__file__).parent.parent / "docs" / "configuration.md"


def _key(registered: RegisteredKey) -> str:
    """The key as the docs write it: a bigint, a pair, or a namespace's first int."""
    if registered.objid is None:
        return f"({AdvisoryKey.from_oids(registered.classid, 0, INT_PAIR_KEY).parts[0]}, *)"
    return str(AdvisoryKey.from_oids(registered.classid, registered.objid, registered.objsubid))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "a", "text": "x", "hash": "crc32", "form": "pair"},
         "form pair does not fit hash crc32: it can be bigint or int or namespace"),
        ({"name": "a", "text": "x", "hash": "sha256", "form": "int"},
         "form int does not fit hash sha256: it can be bigint or pair or namespace"),
        ({"name": "a", "text": "x", "hash": "hashtextextended", "form": "namespace"},
         "form namespace does not fit hash hashtextextended: it can be bigint"),
        ({"name": "a", "text": "x", "hash": "crc32", "byte_order": "little"},
         "byte_order only applies to a digest"),
        ({"name": "a", "key": 1, "form": "pair"}, "only apply to text"),
        ({"name": "a", "key": 1, "per_database": True}, "only apply to text"),
        ({"name": "a", "text": "pgboss", "hash": "sha224", "per_database": True},
         "names no {database}"),
        ({"name": "a", "text": "{db}.x", "hash": "sha224", "per_database": True},
         "{db} is not {database}"),
        ({"name": "a", "text": "{database.__class__}", "hash": "md5", "per_database": True},
         "{database.__class__} is not {database}"),
        ({"name": "a", "text": "{database!r}", "hash": "md5", "per_database": True},
         "{database!r} is not {database}"),
        ({"name": "a", "text": "{database:>9}", "hash": "md5", "per_database": True},
         "{database:>9} is not {database}"),
        ({"name": "a", "text": "{database", "hash": "md5", "per_database": True},
         "write {{ and }} for a brace"),
        ({"name": "a", "text": "x", "hash": "sha512"}, "Input should be 'md5'"),
        ({"name": "a", "key": 1, "level": "statement"}, "Input should be 'session'"),
    ],
)  # fmt: skip
def test_each_form_is_checked(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        KeyConfig.model_validate(entry)


def test_the_forms_of_each_hash() -> None:
    assert forms_of("crc32") == ("bigint", "int", "namespace")  # unsigned, or read signed
    assert forms_of("hashtext") == ("bigint", "namespace")  # a signed int4 already
    assert forms_of("sha256") == ("bigint", "pair", "namespace")
    assert forms_of("hashtextextended") == ("bigint",)
    assert template_error("{database}.pgboss.{{x}}") is None


def test_digest_prefixes_in_both_byte_orders() -> None:
    # sha256("abc") starts ba7816bf 8f01cfea.
    assert digest_parts("sha256", "abc", "bigint", "big") == (
        int.from_bytes(bytes.fromhex("ba7816bf8f01cfea"), "big", signed=True),
    )
    assert digest_parts("sha256", "abc", "pair", "big") == (
        int.from_bytes(bytes.fromhex("ba7816bf"), "big", signed=True),
        int.from_bytes(bytes.fromhex("8f01cfea"), "big", signed=True),
    )
    assert digest_parts("sha256", "abc", "pair", "little") == (
        int.from_bytes(bytes.fromhex("ba7816bf"), "little", signed=True),
        int.from_bytes(bytes.fromhex("8f01cfea"), "little", signed=True),
    )
    assert digest_parts("sha256", "abc", "namespace", "little") == (
        int.from_bytes(bytes.fromhex("ba7816bf"), "little", signed=True),
    )
    # crc32("pgqueuer") = 2389487409, above an int4: the bigint as is, the namespace signed.
    assert crc32_parts("pgqueuer", "bigint") == (2389487409,)
    assert crc32_parts("pgqueuer", "namespace") == (2389487409 - 2**32,)


def test_per_database_texts_are_written_out_for_each_database() -> None:
    boss = KeyConfig(name="boss", text="{database}.pgboss.{{x}}", hash="sha224", per_database=True)
    only = boss.model_copy(update={"name": "only", "databases": ("b",)})
    expanded = expand([boss, only, KeyConfig(name="k", key=1)], ["b", "a"])
    assert [(c.name, c.text, c.databases) for c in expanded] == [
        ("boss", "a.pgboss.{x}", ("a",)),
        ("boss", "b.pgboss.{x}", ("b",)),
        ("only", "b.pgboss.{x}", ("b",)),
        ("k", None, ()),
    ]


def test_keys_of_one_entry_that_coincide_merge_and_names_are_listed_once() -> None:
    # "plumless" and "buckeroo" have the same CRC-32: one key for both databases.
    entry = KeyConfig(name="mig", text="{database}", hash="crc32", per_database=True, max_hold=60)
    registry = Registry.resolve([entry], None, databases=["buckeroo", "plumless", "shop"])
    assert [(k.name, k.config.databases) for k in registry.keys] == [
        ("mig", ("buckeroo", "plumless")),
        ("mig", ("shop",)),
    ]
    assert [k.name for k in registry.entries] == ["mig"]


def test_server_hashes_are_asked_once_and_left_out_without_the_server() -> None:
    asked: list[tuple[list[str], list[int | None]]] = []

    def server(texts: Any, seeds: Any) -> list[int]:
        asked.append((list(texts), list(seeds)))
        return [-988976779, 1734705784, 7]

    configs = [
        KeyConfig(name="maint", text="pg_partman run_maintenance", hash="hashtext"),
        KeyConfig(name="data", text="pg_partman partition_data_proc", hash="hashtext",
                  form="namespace"),
        KeyConfig(name="ext", text="job", hash="hashtextextended", seed=3),
        KeyConfig(name="local", text="job", hash="md5"),
    ]  # fmt: skip
    registry = Registry.resolve(configs, server)
    assert asked == [(["pg_partman run_maintenance", "pg_partman partition_data_proc", "job"],
                      [None, None, 3])]  # fmt: skip
    assert [(k.name, _key(k)) for k in registry.keys] == [
        ("maint", "-988976779"),
        ("data", "(1734705784, *)"),
        ("ext", "7"),
        ("local", str(digest_parts("md5", "job", "bigint", "big")[0])),
    ]
    assert [k.name for k in Registry.resolve(configs, None).keys] == ["local"]


def test_a_catalog_namespace_gives_way_to_the_users_pair_inside_it() -> None:
    repack = KeyConfig(name="pg_repack", namespace=16185446)
    notes: list[str] = []
    registry = Registry.resolve(
        [KeyConfig(name="mine", pair=(16185446, 7))], None, [repack], notes.append
    )
    assert [k.name for k in registry.keys] == ["mine"]
    assert notes == [
        "key 'mine' (pair (16185446, 7)) of the registry names the lock of the catalog's "
        "'pg_repack': it keeps its name"
    ]
    with pytest.raises(ValueError, match="name the same lock"):
        check_configs(
            [
                KeyConfig(name="a", text="pgqueuer", hash="crc32"),
                KeyConfig(name="b", key=2389487409),
            ]
        )


# -- The worked examples of docs/configuration.md ------------------------------------------


def _examples_section() -> str:
    return DOCS.read_text().split("### Keys that libraries compute", 1)[1].split("\n## ", 1)[0]


def worked_examples_yaml() -> list[dict[str, Any]]:
    """The `keys` of the docs' "Keys that libraries compute", as the file gives them."""
    block = _examples_section().split("```yaml\n", 1)[1].split("```", 1)[0]
    keys: list[dict[str, Any]] = load_yaml(block)["keys"]
    return keys


def worked_examples() -> tuple[list[KeyConfig], dict[str, tuple[str, str]]]:
    """The entries of the docs' "Keys that libraries compute", and for each its table row:
    the database it is in (or "any"), and the lock it names."""
    configs = [KeyConfig.model_validate(entry) for entry in worked_examples_yaml()]
    rows = re.findall(r"^\| `(\w+)` \| `?(\w+)`? \| `([^`]+)`", _examples_section(), re.MULTILINE)
    return configs, {name: (database, key) for name, database, key in rows}


def examples_resolved(server: Any = None) -> dict[str, tuple[str, str]]:
    """Each example's key in its table row's database, as the exporter resolves it."""
    configs, rows = worked_examples()
    databases = sorted({database for database, _ in rows.values() if database != "any"})
    registry = Registry.resolve(configs, server, databases=databases)
    found: dict[str, tuple[str, str]] = {}
    for key in registry.keys:
        database = key.config.databases[0] if key.config.databases else "any"
        found[key.name] = (database, _key(key))
    return found


def test_the_worked_examples_are_what_the_registry_resolves() -> None:
    configs, rows = worked_examples()
    assert len(configs) == len(rows) == 8
    check_configs(configs)
    local = {name: row for name, row in rows.items() if name != "jobs_pgqueuer_statistics"}
    assert examples_resolved() == local  # hashtext() is the server's: test_key_libraries.py
    assert {k.objsubid for k in Registry.resolve(configs, None).keys} == {
        BIGINT_KEY,
        INT_PAIR_KEY,
    }


def test_django_pglocks_1_is_its_crc32_read_as_a_signed_int() -> None:
    """django-pglocks 1.0.4 cannot be installed beside the 2.1.0 that test_key_libraries.py
    runs: its key of a name, as its advisory_lock() computes it (django_pglocks/__init__.py),
    is the docs' row, and a negative one, which an unsigned crc32 never is."""

    def django_pglocks_1(lock_id: str) -> int:
        pos = zlib.crc32(lock_id.encode("utf-8"))
        lock_id_int = (2**31 - 1) & pos
        if pos & 2**31:
            lock_id_int -= 2**31
        return lock_id_int

    key = django_pglocks_1("nightly-billing")
    assert key < 0
    assert worked_examples()[1]["nightly_billing_django_1"] == ("any", str(key))
