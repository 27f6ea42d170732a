"""How a text becomes an advisory lock key, as real libraries derive theirs: a digest's first
eight bytes (md5, sha1, sha224, sha256), a CRC-32, or PostgreSQL's own hashtext() and
hashtextextended(), and a text written per database (pg-boss keys its lock by the database's
name)."""

from __future__ import annotations

import hashlib
import string
import zlib
from typing import Literal, get_args

from .key import signed

Hash = Literal["md5", "sha1", "sha224", "sha256", "crc32", "hashtext", "hashtextextended"]
# What the key is made of: one bigint, an (int, int) pair, or every pair whose first int it
# is; or one bigint of a 32-bit hash's bits read as a signed int (django-pglocks 1).
Form = Literal["bigint", "pair", "namespace", "int"]
ByteOrder = Literal["big", "little"]

HASHES: tuple[str, ...] = get_args(Hash)
# The first eight bytes of a digest: `('x' || left(md5(t), 16))::bit(64)::bigint` in SQL, and
# what Python's int.from_bytes or Node's readInt32LE make of them in the libraries.
DIGESTS = frozenset({"md5", "sha1", "sha224", "sha256"})
# Internal to PostgreSQL, changed between major versions before, and dependent on the server's
# byte order: only the server may compute them, after each connect.
SERVER_HASHES = frozenset({"hashtext", "hashtextextended"})
# 32-bit values: a bigint key of that value, or the first int of a pair.
NARROW_HASHES = frozenset({"crc32", "hashtext"})

# The one field a per-database text may name: `{database}`, the database's name.
DATABASE_FIELD = "database"


def forms_of(hash_name: str) -> tuple[str, ...]:
    """The forms a hash's value can take: a 64-bit value is a bigint or splits into a pair (a
    namespace is the pair's first int); a 32-bit one is a bigint or a namespace."""
    if hash_name == "crc32":  # unsigned; hashtext's int4 is signed already
        return ("bigint", "int", "namespace")
    if hash_name in NARROW_HASHES:
        return ("bigint", "namespace")
    if hash_name in DIGESTS:
        return ("bigint", "pair", "namespace")
    return ("bigint",)


def digest_parts(hash_name: str, text: str, form: str, byte_order: str) -> tuple[int, ...]:
    """A digest's first eight bytes as one signed bigint, or as two signed int4s (bytes 0-3
    and 4-7), each read in `byte_order`; a namespace is the first of the two."""
    prefix = hashlib.new(hash_name, text.encode()).digest()[:8]
    order: Literal["big", "little"] = "little" if byte_order == "little" else "big"
    if form == "bigint":
        return (int.from_bytes(prefix, order, signed=True),)
    pair = (
        int.from_bytes(prefix[:4], order, signed=True),
        int.from_bytes(prefix[4:], order, signed=True),
    )
    return pair if form == "pair" else pair[:1]


def crc32_parts(text: str, form: str) -> tuple[int, ...]:
    """The IEEE CRC-32 of the UTF-8 text (zlib's, Ruby's Zlib.crc32, Go's ChecksumIEEE): an
    unsigned bigint, or its 32 bits read as a signed int4, as an int (a bigint key of that
    value) or a namespace."""
    value = zlib.crc32(text.encode())
    return (value,) if form == "bigint" else (signed(value, 32),)


def local_parts(hash_name: str, text: str, form: str, byte_order: str) -> tuple[int, ...]:
    """The key's parts for a hash the exporter computes itself."""
    if hash_name in DIGESTS:
        return digest_parts(hash_name, text, form, byte_order)
    if hash_name == "crc32":
        return crc32_parts(text, form)
    raise ValueError(f"{hash_name} is computed by the server")


def template_error(text: str) -> str | None:
    """Why `text` is no per-database text, or None: `{database}` is its one field, written
    bare; `{{` and `}}` are braces."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        return f"{exc} (write {{{{ and }}}} for a brace)"
    fields = [(name, spec, conversion) for _, name, spec, conversion in parsed if name is not None]
    if not fields:
        return "names no {database}: without it the text is the same in every database"
    for name, spec, conversion in fields:
        if name != DATABASE_FIELD or spec or conversion:
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            return f"{shown} is not {{database}}, the one field it may name"
    return None


def for_database(text: str, database: str) -> str:
    """The per-database text written out for `database` (template_error(text) is None)."""
    return text.format_map({DATABASE_FIELD: database})
