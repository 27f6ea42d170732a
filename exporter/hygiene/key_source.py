"""Where an advisory lock's key comes from: whether an undocumented hash (hashtext() and its
kin) computes an argument of an advisory lock function, followed through the parse tree.

A hash in the same statement is not enough: `SELECT hashtext($1), pg_advisory_xact_lock($2)`
selects a hash beside a lock, and `SELECT pg_advisory_xact_lock(id) FROM t WHERE
hashtext(state) <> $1` filters by one; neither key comes from it. What counts is the value an
argument is computed from: the argument itself, the arguments of a function or operator over
it (`pg_advisory_lock(1001, hashtext(x))`, `(hashtext(a || b) & 2147483647)::bigint`), a
cast, a CASE's results, a COALESCE's values, a scalar sub-select's output, and a column taken
from a CTE, a subquery, a VALUES or a function in FROM (`FROM (SELECT hashtext($1) AS h) AS
k`), found by its name as the server finds it. A condition (a WHERE, a CASE's WHEN, a FILTER,
an ORDER BY) never computes a key.

The walk is bounded as the rest of the hygiene rules are, whatever the text: no recursion (a
tree can be as deep as its text is long), each Node followed at most once in each scope,
each FROM item's column resolved once, names found through an index of each level's columns,
and a column or a CTE looked for at most _LEVELS_OUT levels out (a reference from deeper is
not followed: no statement a person writes reaches that far).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .parse_tree import (
    ARMS,
    KEYED,
    NO_SET_OPERATION,
    SELECT,
    Fields,
    as_list,
    children,
    function,
    node,
    string,
)

# Hash support functions of PostgreSQL's text-like types: undocumented and 32 bits wide, so
# keys from them collide. hashtextextended() (64 bits, seeded) is the safe form the rule
# recommends, not one of them.
UNDOCUMENTED_HASHES = frozenset({"hashtext", "hashbpchar", "hashvarlena", "hashname"})

# Scopes a column reference is looked for in, from its own outwards (two a level: its WITH's
# and its FROM's).
_LEVELS_OUT = 32
_SCOPES_OUT = 2 * _LEVELS_OUT

# The statements that make a level of names: a WITH, FROM items, a target table.
_STATEMENTS = frozenset({SELECT, "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"})
# The FROM items of each, where a reference's table or column is found.
_FROM = {
    SELECT: ("fromClause",),
    "UpdateStmt": ("relation", "fromClause"),
    "DeleteStmt": ("relation", "usingClause"),
    "MergeStmt": ("relation", "sourceRelation"),
    "InsertStmt": ("relation",),
}
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

_Value = tuple[object, "_Scope"]  # an expression, and the scope its names are found in


@dataclass(eq=False)
class _Source:
    """A FROM item: a table (its columns unknown), or what says where its columns come
    from: a query (a subquery, a CTE) or functions."""

    name: str | None
    scope: _Scope  # where the names of its query or functions are found
    columns: tuple[str, ...] = ()  # given by the alias or the CTE, in order
    query: tuple[str, Fields] | None = None
    functions: tuple[object, ...] = ()

    def names(self) -> tuple[frozenset[str], bool] | None:
        """Its columns' names, and whether a star passes on others not written; None for a
        table, whose columns are not known."""
        if self.functions:
            return frozenset(self.columns), False
        if self.query is None:
            return None
        row = _first_row(self.query)
        written = {name for name, value in row[len(self.columns) :] if name and not _star(value)}
        return frozenset(self.columns) | written, any(_star(value) for _, value in row)


@dataclass
class _Index:
    """A level's FROM items by name and by column, those whose star passes on columns
    not written, and whether one is a table whose columns are not known."""

    by_name: dict[str, list[_Source]] = field(default_factory=dict)
    by_column: dict[str, list[_Source]] = field(default_factory=dict)
    starred: list[_Source] = field(default_factory=list)
    tables: bool = False


@dataclass(eq=False)
class _Scope:
    """The names one level of a statement sees: its CTEs (a WITH's scope), or its FROM
    items (the scope inside that), then the levels around it."""

    parent: _Scope | None
    ctes: dict[str, Fields] = field(default_factory=dict)  # CommonTableExpr fields by name
    sources: list[_Source] = field(default_factory=list)
    _index: _Index | None = None  # made on the first lookup

    def cte(self, name: str) -> tuple[Fields, _Scope] | None:
        """The CTE of that name visible here (within _LEVELS_OUT levels), and the scope of
        the WITH that defines it."""
        at: _Scope | None = self
        for _ in range(_SCOPES_OUT):
            if at is None:
                break
            if name in at.ctes:
                return at.ctes[name], at
            at = at.parent
        return None

    def index(self) -> _Index:
        if self._index is None:
            index = _Index()
            for source in self.sources:
                if source.name is not None:
                    index.by_name.setdefault(source.name, []).append(source)
                found = source.names()
                if found is None:
                    index.tables = True
                    continue
                for column in found[0]:
                    index.by_column.setdefault(column, []).append(source)
                if found[1]:
                    index.starred.append(source)
            self._index = index
        return self._index


def hash_keyed(statement: object) -> bool:
    """Whether an undocumented hash computes an argument of an advisory lock function
    (one that takes a key: the locks, and the unlocks of one key) in this statement."""
    trace = _Trace()
    pending: list[_Value] = [(statement, _Scope(None))]
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
        if kind in _STATEMENTS:
            scope = trace.scope_of(kind, fields, scope)
        elif (
            kind == "FuncCall"
            and function(fields) in KEYED
            and trace.hashed(fields.get("args"), scope)
        ):
            return True
        pending.extend((child, scope) for child in children(kind, fields))
    return False


class _Trace:
    """The scopes of one statement's levels, and what has been followed already: once
    followed without finding a hash, a Node or a column has nothing more to give."""

    def __init__(self) -> None:
        self._scopes: dict[int, _Scope] = {}  # by id() of a statement's fields
        self._parents: dict[int, _Scope] = {}  # a CTE's or subquery's, set by its level
        self._followed: set[tuple[int, int]] = set()  # (id of a Node's fields, id of a scope)
        self._columns: set[tuple[int, str]] = set()  # (id of a source, column)

    def scope_of(self, kind: str, fields: Fields, around: _Scope) -> _Scope:
        """The scope of a statement's level: made once, inside the scope given for it by the
        level that names it (a CTE's WITH, a subquery's FROM), else inside `around`."""
        made = self._scopes.get(id(fields))
        if made is not None:
            return made
        with_scope = _Scope(self._parents.get(id(fields), around), _ctes(fields))
        for cte in with_scope.ctes.values():
            if (query := node(cte.get("ctequery"))) is not None:
                self._parents[id(query[1])] = with_scope  # a CTE sees its WITH, not the FROM
        scope = _Scope(with_scope)
        scope.sources = [
            self._source(item, with_scope, scope)
            for name in _FROM.get(kind, ())
            for item in _from_items(fields.get(name))
        ]
        self._scopes[id(fields)] = scope
        return scope

    def _source(self, item: tuple[str, Fields], with_scope: _Scope, scope: _Scope) -> _Source:
        kind, fields = item
        alias = fields.get("alias")
        alias_fields = alias if isinstance(alias, dict) else {}
        alias_name = alias_fields.get("aliasname")
        named = alias_name if isinstance(alias_name, str) else None
        columns = _names(alias_fields.get("colnames"))
        if kind == "RangeSubselect" and (query := node(fields.get("subquery"))) is not None:
            # Only a LATERAL subquery sees the FROM items before it.
            around = scope if fields.get("lateral") else with_scope
            self._parents[id(query[1])] = around
            return _Source(named, around, columns, query)
        if kind == "RangeFunction":
            # Its calls see the FROM items before it, as a LATERAL subquery does.
            functions = tuple(_functions(fields))
            name = named or _name_of(functions[0] if functions else None)
            columns = columns or _function_columns(name, functions)
            return _Source(name, scope, columns, functions=functions)
        relname = fields.get("relname")
        if kind != "RangeVar" or not isinstance(relname, str):
            return _Source(named, scope)  # a table function, XMLTABLE...: columns unknown
        cte = scope.cte(relname) if fields.get("schemaname") is None else None
        if cte is not None and (query := node(cte[0].get("ctequery"))) is not None:
            given = _names(cte[0].get("aliascolnames"))
            return _Source(named or relname, cte[1], columns or given, query)
        return _Source(named or relname, scope)

    def hashed(self, value: object, scope: _Scope) -> bool:
        """Whether an undocumented hash computes `value`, its names found from `scope`."""
        pending: list[_Value] = [(value, scope)]
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
                pending.extend(self._resolve(fields, at))
            elif kind == "SubLink":
                subselect = node(fields.get("subselect"))
                if fields.get("subLinkType") in _SCALAR_SUBLINKS and subselect is not None:
                    query = self.scope_of(*subselect, at)
                    pending.extend(self._output(subselect, query, (), position=0))
            elif kind == "CaseExpr":
                pending.append((fields.get("defresult"), at))
                results = (node(when) for when in as_list(fields.get("args")))
                pending.extend((when[1].get("result"), at) for when in results if when)
            else:
                pending.extend((fields.get(name), at) for name in _VALUES.get(kind, ()))
        return False

    def _resolve(self, reference: Fields, scope: _Scope) -> list[_Value]:
        """What a column reference names, found as the server finds it: a qualified one in
        the nearest level with a FROM item of that name, an unqualified one in the nearest
        level with a column of that name. A level with a table whose columns are unknown
        ends an unqualified search: the name may be that table's."""
        parts = [string(part) for part in as_list(reference.get("fields"))]
        names = [part for part in parts if part is not None]
        if not names or len(names) != len(parts):
            return []  # a star, or something odd
        column, qualifier = names[-1], (names[-2] if len(names) > 1 else None)
        at: _Scope | None = scope
        out = 0
        while at is not None and out < _SCOPES_OUT:
            index = at.index()
            if qualifier is not None and qualifier in index.by_name:
                return self._columns_of(index.by_name[qualifier], column)
            if qualifier is None and column in index.by_column:
                return self._columns_of(index.by_column[column], column)
            if qualifier is None and (index.starred or index.tables):
                found = self._columns_of(index.starred, column)
                if found or index.tables:
                    return found
            at, out = at.parent, out + 1
        return []

    def _columns_of(self, sources: list[_Source], column: str) -> list[_Value]:
        """The expressions that give a column of these FROM items, each item's column
        resolved once in the statement."""
        found: list[_Value] = []
        for source in sources:
            if (id(source), column) in self._columns:
                continue
            self._columns.add((id(source), column))
            if source.functions:
                if column in source.columns:
                    # One function with several columns gives a record: each is its.
                    position = min(source.columns.index(column), len(source.functions) - 1)
                    found.append((source.functions[position], source.scope))
            elif source.query is not None:
                scope = self.scope_of(*source.query, source.scope)
                found += self._output(source.query, scope, source.columns, name=column)
        return found

    def _output(
        self,
        query: tuple[str, Fields],
        scope: _Scope,
        columns: tuple[str, ...],
        *,
        name: str | None = None,
        position: int | None = None,
    ) -> list[_Value]:
        """The expressions of a query's output column, by name (after the alias's `columns`)
        or position, in every branch of a set operation and every row of a VALUES, each with
        its level's scope."""
        leaves = list(self._leaves(query, scope))
        first, first_scope = leaves[0]
        row = next(iter(_rows(first)), [])
        if any(_star(value) for _, value in row):
            # A star passes its level's columns through in an order the tree does not say:
            # a column is found by its name only, among those written or through the star.
            if name is None or name in columns:
                return []
            written = [value for given, value in row if given == name]
            return [(written[0] if written else _reference(name), first_scope)]
        if name is not None:
            names = [*columns, *(given for given, _ in row[len(columns) :])]
            if name not in names:
                return []
            position = names.index(name)
        if position is None:
            return []
        return [
            (each[position][1], leaf_scope)
            for leaf, leaf_scope in leaves
            for each in _rows(leaf)
            if position < len(each)
        ]

    def _leaves(self, query: tuple[str, Fields], scope: _Scope) -> Iterator[tuple[Fields, _Scope]]:
        """The levels that give a query's rows, left to right: the branches of a set
        operation (each a SELECT or VALUES of its own), else the query itself."""
        kind, fields = query
        if kind != SELECT:
            yield {"returning": _returning(fields)}, scope
            return
        pending = [(fields, scope)]
        while pending:
            level, at = pending.pop()
            if level.get("op", NO_SET_OPERATION) == NO_SET_OPERATION:
                yield level, at
                continue
            arms = [level.get(name) for name in ARMS]
            pending += [
                (arm, self.scope_of(SELECT, arm, at))
                for arm in reversed(arms)
                if isinstance(arm, dict)
            ]


def _names(value: object) -> tuple[str, ...]:
    """The names of a list of String nodes (an alias's columns, a CTE's)."""
    return tuple(name for name in map(string, as_list(value)) if name is not None)


def _ctes(fields: Fields) -> dict[str, Fields]:
    clause = fields.get("withClause")
    ctes: dict[str, Fields] = {}
    for item in as_list(clause.get("ctes") if isinstance(clause, dict) else None):
        found = node(item)
        if found is not None and isinstance(name := found[1].get("ctename"), str):
            ctes[name] = found[1]
    return ctes


def _from_items(value: object) -> Iterator[tuple[str, Fields]]:
    """The FROM items of a clause, left to right (a join's two sides, at any depth), or a
    statement's target table (a struct: a RangeVar without its type's name)."""
    pending = list(reversed(value)) if isinstance(value, list) else [value]
    while pending:
        item = pending.pop()
        found = node(item)
        if found is None:
            if isinstance(item, dict) and "relname" in item:
                yield "RangeVar", item
            continue
        if found[0] == "JoinExpr":
            pending += [found[1].get("rarg"), found[1].get("larg")]
        elif found[0] == "RangeTableSample":
            pending.append(found[1].get("relation"))
        else:
            yield found


def _functions(fields: Fields) -> Iterator[object]:
    """A RangeFunction's calls (each in a List with its column definitions)."""
    for item in as_list(fields.get("functions")):
        found = node(item)
        items = as_list(found[1].get("items")) if found is not None else []
        if items:
            yield items[0]


def _function_columns(name: str | None, functions: tuple[object, ...]) -> tuple[str, ...]:
    """The columns of functions in FROM without an alias's: one function's is the item's
    name (its alias, else its own), several functions' theirs."""
    if len(functions) == 1:
        return (name,) if name else ()
    return tuple(n for n in map(_name_of, functions) if n)


def _reference(name: str) -> object:
    """A reference to a column by its name alone, as a star at a level stands for."""
    return {"ColumnRef": {"fields": [{"String": {"sval": name}}]}}


def _first_row(query: tuple[str, Fields]) -> list[tuple[str | None, object]]:
    """The output of a query's first branch (a set operation's columns are named by it)."""
    kind, fields = query
    if kind != SELECT:
        return _rows({"returning": _returning(fields)})[0]
    while fields.get("op", NO_SET_OPERATION) != NO_SET_OPERATION:
        left = fields.get(ARMS[0])
        if not isinstance(left, dict):
            return []
        fields = left
    return next(iter(_rows(fields)), [])


def _rows(level: Fields) -> list[list[tuple[str | None, object]]]:
    """A level's output rows as (column name, expression): a SELECT's one target list, each
    row of a VALUES, a data-changing statement's RETURNING."""
    if "returning" in level:
        return [[_target(item) for item in as_list(level["returning"])]]
    values = as_list(level.get("valuesLists"))
    if values:
        rows: list[list[tuple[str | None, object]]] = []
        for row in values:
            found = node(row)
            items = as_list(found[1].get("items")) if found else []
            rows.append([(f"column{i + 1}", item) for i, item in enumerate(items)])
        return rows
    return [[_target(item) for item in as_list(level.get("targetList"))]]


def _returning(fields: Fields) -> list[object]:
    clause = fields.get("returningClause")  # PostgreSQL 18's grammar; returningList before
    if isinstance(clause, dict):
        return as_list(clause.get("exprs"))
    return as_list(fields.get("returningList"))


def _target(item: object) -> tuple[str | None, object]:
    found = node(item)
    if found is None or found[0] != "ResTarget":
        return None, None
    name = found[1].get("name")
    value = found[1].get("val")
    return (name if isinstance(name, str) else _name_of(value)), value


def _star(value: object) -> bool:
    found = node(value)
    return (
        found is not None
        and found[0] == "ColumnRef"
        and any(node(part) == ("A_Star", {}) for part in as_list(found[1].get("fields")))
    )


def _name_of(value: object) -> str | None:
    """The name the server gives an output column of this expression when no alias does
    (its FigureColname, for the forms a key is taken from): a column's, a function's; through
    a cast, its argument's, else the type's."""
    while (found := node(value)) is not None:
        kind, fields = found
        if kind in ("ColumnRef", "FuncCall"):
            parts = as_list(fields.get("fields" if kind == "ColumnRef" else "funcname"))
            return string(parts[-1]) if parts else None
        if kind != "TypeCast":
            return {"CaseExpr": "case", "CoalesceExpr": "coalesce"}.get(kind)
        inner = _name_of(fields.get("arg"))
        if inner is not None:
            return inner
        type_name = fields.get("typeName")
        names = as_list(type_name.get("names")) if isinstance(type_name, dict) else []
        return string(names[-1]) if names else None
    return None
