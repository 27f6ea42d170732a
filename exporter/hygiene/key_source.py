"""Where an advisory lock's key comes from: whether an undocumented hash computes it.

Whether hashtext() or its kin computes an argument of an advisory lock function is followed
through the parse tree. A hash in the same statement is not enough: `SELECT hashtext($1),
pg_advisory_xact_lock($2)` selects a hash beside a lock, and `SELECT
pg_advisory_xact_lock(id) FROM t WHERE hashtext(state) <> $1` filters by one; neither key
comes from it. What counts is the value an argument is computed from: the argument itself,
the arguments of a function or operator over it (`pg_advisory_lock(1001, hashtext(x))`,
`(hashtext(a || b) & 2147483647)::bigint`), a cast, a CASE's results, a COALESCE's values, a
scalar sub-select's output, and a column taken from a CTE, a subquery, a VALUES or a
function in FROM (`FROM (SELECT hashtext($1) AS h) AS k`), found by its name as the server
finds it. A condition (a WHERE, a CASE's WHEN, a FILTER, an ORDER BY) never computes a key.

The walk is bounded as the rest of the hygiene rules are, whatever the text: no recursion (a
tree can be as deep as its text is long), each Node followed at most once in each scope,
and, where names are found (name_scopes.py), each FROM item's column resolved once, names
found through an index of each level's columns, and a column or a CTE looked for at most
_LEVELS_OUT levels out (a reference from deeper is not followed: no statement a person
writes reaches that far).
"""

from __future__ import annotations

from .name_scopes import STATEMENTS, Names, Scope, Value
from .parse_tree import KEYED, as_list, children, function, node

# Hash support functions of PostgreSQL's text-like types: undocumented and 32 bits wide, so
# keys from them collide. hashtextextended() (64 bits, seeded) is the safe form the rule
# recommends, not one of them.
UNDOCUMENTED_HASHES = frozenset({"hashtext", "hashbpchar", "hashvarlena", "hashname"})

# The fields an expression's value is computed from (a CASE is apart: its WHENs are
# conditions).
_VALUES = {
    "TypeCast": ("arg",),
    "CollateClause": ("arg",),
    "NamedArgExpr": ("arg",),
    "A_Indirection": ("arg",),
    "A_Expr": ("lexpr", "rexpr"),
    "CoalesceExpr": ("args",),
    "MinMaxExpr": ("args",),
    "A_ArrayExpr": ("elements",),
}
_SCALAR_SUBLINKS = frozenset({"EXPR_SUBLINK", "ARRAY_SUBLINK"})


def hash_keyed(statement: object) -> bool:
    """Whether an undocumented hash computes an argument of an advisory lock function
    (one that takes a key: the locks, and the unlocks of one key) in this statement."""
    trace = _Trace(Names())
    pending: list[Value] = [(statement, Scope(None))]
    while pending:
        item, scope = pending.pop()
        if isinstance(item, list):
            pending.extend((each, scope) for each in item)
            continue
        if (found := node(item)) is None:
            if isinstance(item, dict):  # a struct's fields: an alias, a WITH clause
                pending.extend((each, scope) for each in item.values())
            continue
        kind, fields = found
        if kind in STATEMENTS:
            scope = trace.names.scope_of(kind, fields, scope)
        elif (
            kind == "FuncCall"
            and function(fields) in KEYED
            and trace.hashed(fields.get("args"), scope)
        ):
            return True
        pending.extend((child, scope) for child in children(kind, fields))
    return False


class _Trace:
    """What has been followed already in one statement: once followed without finding a
    hash, a Node has nothing more to give in that scope. Its names are found by `names`."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self._followed: set[tuple[int, int]] = set()  # (id of a Node's fields, id of a scope)

    def hashed(self, value: object, scope: Scope) -> bool:
        """Whether an undocumented hash computes `value`, its names found from `scope`."""
        pending: list[Value] = [(value, scope)]
        while pending:
            item, at = pending.pop()
            if isinstance(item, list):
                pending.extend((each, at) for each in item)
                continue
            if (found := node(item)) is None:
                continue
            kind, fields = found
            if (id(fields), id(at)) in self._followed:
                continue
            self._followed.add((id(fields), id(at)))
            if kind == "FuncCall":
                if function(fields) in UNDOCUMENTED_HASHES:
                    return True
                pending.extend((arg, at) for arg in as_list(fields.get("args")))
            elif kind == "ColumnRef":
                pending.extend(self.names.resolve(fields, at))
            elif kind == "SubLink":
                subselect = node(fields.get("subselect"))
                if fields.get("subLinkType") in _SCALAR_SUBLINKS and subselect is not None:
                    query = self.names.scope_of(*subselect, at)
                    pending.extend(self.names.output(subselect, query, (), position=0))
            elif kind == "CaseExpr":
                pending.append((fields.get("defresult"), at))
                results = (node(when) for when in as_list(fields.get("args")))
                pending.extend((when[1].get("result"), at) for when in results if when)
            else:
                pending.extend((fields.get(name), at) for name in _VALUES.get(kind, ()))
        return False
