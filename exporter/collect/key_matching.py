"""The collection statement's match of the key registry: the aggregates that give each
backend's registered keys, written for this registry's keys (snapshot.py builds the statement
with them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY

# A lock's key columns as one bigint: keys.key.bigint_of_oids, in SQL (the registry's keys are
# given packed by it).
_PACKED_KEY = "(l.classid::bigint << 32) | l.objid::bigint"

# Matching the key registry, which the built-in catalog puts on every target: every
# collection pays for it, on every lock row. So a row pays for one cheap test, a screen,
# and only the rows that pass it are matched in full, with no join and no second GROUP BY
# column (measured at 100,000 locks: the two hash joins this replaces cost about 0.3x the
# bare count more than this, and a second grouping column about 0.1x more, even where it is
# NULL for most rows, since every row then hashes two values).
# - Exact keys (bigint keys and int pairs): the screen is "is the lock's objid one of the
#   registered keys' objids", a hashed `= ANY`. A row that passes yields a code: the key's
#   position in the registry times 2, plus 1 for an awaited lock, after locktype, the key
#   form and the full packed key are checked (NULL for a row that passed by coincidence).
#   A backend holds an exact key at most twice (once per mode), so its codes are few.
# - Namespaces: the screen is "an int pair whose first int is a registered namespace". A
#   namespace can cover thousands of a backend's locks, so its codes are counted in
#   backend_locks with array_positions, one scan per namespace and backend, rather than
#   unnested and grouped like the exact keys' (measured with 100,000 locks in one
#   namespace: about 0.15x the bare count instead of 0.35x). A count aggregate per
#   namespace would be cheaper still there, but every lock row would pay for each one.
# - backend_locks turns each backend's codes into [key index, entries (held and awaited),
#   awaited] per key, as _key_uses reads them; a backend without codes skips it.
# - The registry's arrays are written into the statement as constants, not bound:
#   PostgreSQL (14 and later) hashes an `= ANY` over a constant array of 9 or more
#   elements, where a bound array is scanned element by element on every row once the
#   statement runs on a generic plan (psycopg prepares it at its 5th run, and the server
#   plans it generically after 5 more: measured, the screen then costs 0.3x the bare count
#   more). The values are Python ints, so the text is safe to compose.
_EXACT_CODES = """,
        pg_catalog.array_agg(
            CASE WHEN l.locktype = 'advisory'
                 THEN CASE l.objsubid{forms}
                      END * 2 + (NOT l.granted)::int
            END
        ) FILTER (WHERE l.objid = ANY ({objids})) AS key_codes"""
_NAMESPACE_CODES = """,
        pg_catalog.array_agg(
            CASE l.classid{spaces}
            END * 2 + (NOT l.granted)::int
        ) FILTER (WHERE l.objsubid = {pair} AND l.classid = ANY ({classids})
                    AND l.locktype = 'advisory') AS namespace_codes"""
_REGISTERED_KEYS = """CASE WHEN {present} THEN (
            SELECT pg_catalog.json_agg(
                       pg_catalog.json_build_array(k.key_index, k.entries, k.awaited)
                       ORDER BY k.key_index)
            FROM ({uses}) AS k)
        END"""
_EXACT_USES = """
                SELECT c >> 1 AS key_index, count(*) AS entries, bool_or(c & 1 = 1) AS awaited
                FROM pg_catalog.unnest(key_codes) AS c
                WHERE c IS NOT NULL
                GROUP BY 1"""
_NAMESPACE_USES = """
                SELECT n.key_index, n.held + n.awaited AS entries, n.awaited > 0 AS awaited
                FROM (SELECT i AS key_index,
                             pg_catalog.cardinality(
                                 pg_catalog.array_positions(namespace_codes, i * 2)) AS held,
                             pg_catalog.cardinality(
                                 pg_catalog.array_positions(namespace_codes, i * 2 + 1))
                                 AS awaited
                        FROM pg_catalog.unnest({indexes}) AS i) AS n
                WHERE n.held + n.awaited > 0"""
KeyArrays = tuple[tuple[str, tuple[int, ...]], ...]


def _constant(values: Sequence[int], sql_type: str) -> str:
    """A constant array; int() makes sure nothing but digits and signs reach the text."""
    return "'{" + ",".join(str(int(v)) for v in values) + "}'::" + sql_type + "[]"


def _lookup(index: Sequence[int], keys: Sequence[int], sql_type: str, value: str) -> str:
    """The registry index of `value` in `keys` (NULL if absent): for screened rows only."""
    return (
        f"({_constant(index, 'int')})"
        f"[pg_catalog.array_position({_constant(keys, sql_type)}, {value})]"
    )


def key_matching(arrays: Mapping[str, Sequence[int]]) -> tuple[str, str]:
    """The aggregates that collect a backend's codes, and its registered_keys expression."""
    aggregates, present, uses = "", [], []
    if arrays["objid"]:
        forms = ""
        for form, index, keys in (
            (BIGINT_KEY, arrays["bigint_index"], arrays["bigint_key"]),
            (INT_PAIR_KEY, arrays["pair_index"], arrays["pair_key"]),
        ):
            if keys:
                found = _lookup(index, keys, "int8", f"({_PACKED_KEY})")
                forms += f"\n                      WHEN {form} THEN {found}"
        objids = _constant(arrays["objid"], "oid")
        aggregates += _EXACT_CODES.format(forms=forms, objids=objids)
        present.append("key_codes IS NOT NULL")
        uses.append(_EXACT_USES)
    if arrays["namespace_classid"]:
        spaces = "".join(
            f"\n                 WHEN {classid}::oid THEN {index}"
            for index, classid in zip(
                arrays["namespace_index"], arrays["namespace_classid"], strict=True
            )
        )
        classids = _constant(arrays["namespace_classid"], "oid")
        aggregates += _NAMESPACE_CODES.format(spaces=spaces, pair=INT_PAIR_KEY, classids=classids)
        present.append("namespace_codes IS NOT NULL")
        uses.append(_NAMESPACE_USES.format(indexes=_constant(arrays["namespace_index"], "int")))
    if not present:
        return "", "NULL::json"
    registered = _REGISTERED_KEYS.format(
        present=" OR ".join(present), uses="\n                UNION ALL".join(uses)
    )
    return aggregates, registered
