"""Reading the tree of libpg_query's JSON (`pglast.parser.parse_sql_json`) that the hygiene
rules judge: its Nodes, a walk over them without recursion, and the names of PostgreSQL's
own functions.

The JSON has the protobuf schema's field names: a Node is an object of one key, its type's
name (which alone starts with a capital), whose value holds its fields; a field typed as a
struct rather than a Node (an alias, a WITH clause, a set operation's arms) is the fields
alone, without the name.
"""

from __future__ import annotations

from collections.abc import Iterator

Fields = dict[str, object]

SELECT = "SelectStmt"
NO_SET_OPERATION = "SETOP_NONE"
ARMS = ("larg", "rarg")  # a set operation's two sides, SelectStmt fields without the name
_CATALOG = "pg_catalog"  # the one schema whose functions these are

LOCKING = frozenset(
    {
        "pg_advisory_lock",
        "pg_advisory_lock_shared",
        "pg_try_advisory_lock",
        "pg_try_advisory_lock_shared",
        "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared",
        "pg_try_advisory_xact_lock",
        "pg_try_advisory_xact_lock_shared",
    }
)
# The functions that take a key: those that lock, and the unlocks of one key.
KEYED = LOCKING | {"pg_advisory_unlock", "pg_advisory_unlock_shared"}
ADVISORY = KEYED | {"pg_advisory_unlock_all"}


def node(value: object) -> tuple[str, Fields] | None:
    """A Node's type name and fields, or None for anything else (a struct's fields, a list,
    a scalar)."""
    if isinstance(value, dict) and len(value) == 1:
        [(kind, fields)] = value.items()
        if "A" <= kind[:1] <= "Z" and isinstance(fields, dict):
            return kind, fields
    return None


def as_list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def string(value: object) -> str | None:
    """The text of a String node (a name's part, an alias's column), else None."""
    found = node(value)
    if found is None or found[0] != "String":
        return None
    text = found[1].get("sval")
    return text if isinstance(text, str) else None


def children(kind: str, fields: Fields) -> Iterator[object]:
    """A Node's fields' values, a set operation's arms given as the SelectStmts they are
    (the JSON writes them without their type's name)."""
    for name, field in fields.items():
        arm = kind == SELECT and name in ARMS and isinstance(field, dict)
        yield {SELECT: field} if arm else field


def walk(value: object, *, into_queries: bool) -> Iterator[tuple[str, Fields]]:
    """Every Node below `value` (itself included), without recursion: a tree can be as deep
    as its text is long. Without `into_queries`, a SELECT met below (in a sub-link, a
    subquery in FROM) is neither given nor entered: a level of its own."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        if (found := node(item)) is None:
            if isinstance(item, dict):  # a struct's fields: an alias, a WITH clause
                pending.extend(item.values())
            continue
        kind, fields = found
        if kind == SELECT and not into_queries:
            continue
        yield found
        pending.extend(children(kind, fields))


def function(fields: Fields) -> str | None:
    """The name of a FuncCall that is PostgreSQL's own: unqualified or in pg_catalog. The
    parser has folded an unquoted name to lower case and kept a quoted one as written, so
    "PG_ADVISORY_LOCK" stays another function, as it is to the server."""
    names = []
    for part in as_list(fields.get("funcname")):
        name = string(part)
        if name is None:
            return None
        names.append(name)
    if len(names) == 1:
        return names[0]
    if len(names) == 2 and names[0] == _CATALOG:
        return names[1]
    return None  # another schema's function of the same name, or a database's (a.b.c)
