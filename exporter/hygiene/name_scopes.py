"""Where a statement's names are found, as the server finds them: each level's scope and columns."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .parse_tree import ARMS, NO_SET_OPERATION, SELECT, Fields, as_list, node, string
from .query_levels import (
    column_reference,
    ctes_of,
    first_row,
    from_items,
    function_columns,
    is_star,
    name_of,
    output_rows,
    range_functions,
    returning_list,
    string_names,
)

# Scopes a column reference is looked for in, from its own outwards (two a level: its WITH's
# and its FROM's).
_LEVELS_OUT = 32
_SCOPES_OUT = 2 * _LEVELS_OUT

# The statements that make a level of names: a WITH, FROM items, a target table.
STATEMENTS = frozenset({SELECT, "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"})
# The FROM items of each, where a reference's table or column is found.
_FROM = {
    SELECT: ("fromClause",),
    "UpdateStmt": ("relation", "fromClause"),
    "DeleteStmt": ("relation", "usingClause"),
    "MergeStmt": ("relation", "sourceRelation"),
    "InsertStmt": ("relation",),
}

Value = tuple[object, "Scope"]  # an expression, and the scope its names are found in


@dataclass(eq=False)
class _Source:
    """A FROM item: a table (its columns unknown), or what says where its columns come
    from: a query (a subquery, a CTE) or functions."""

    name: str | None
    scope: Scope  # where the names of its query or functions are found
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
        row = first_row(self.query)
        written = {name for name, value in row[len(self.columns) :] if name and not is_star(value)}
        return frozenset(self.columns) | written, any(is_star(value) for _, value in row)


@dataclass
class _Index:
    """A level's FROM items by name and by column, those whose star passes on columns
    not written, and whether one is a table whose columns are not known."""

    by_name: dict[str, list[_Source]] = field(default_factory=dict)
    by_column: dict[str, list[_Source]] = field(default_factory=dict)
    starred: list[_Source] = field(default_factory=list)
    tables: bool = False


@dataclass(eq=False)
class Scope:
    """The names one level of a statement sees: its CTEs (a WITH's scope), or its FROM
    items (the scope inside that), then the levels around it."""

    parent: Scope | None
    ctes: dict[str, Fields] = field(default_factory=dict)  # CommonTableExpr fields by name
    sources: list[_Source] = field(default_factory=list)
    _index: _Index | None = None  # made on the first lookup

    def cte(self, name: str) -> tuple[Fields, Scope] | None:
        """The CTE of that name visible here (within _LEVELS_OUT levels), and the scope of
        the WITH that defines it."""
        at: Scope | None = self
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


class Names:
    """The scopes of one statement's levels, each made once, and where its column references
    lead: each FROM item's column is given once in the statement (a later reference to it
    has nothing new to follow)."""

    def __init__(self) -> None:
        self._scopes: dict[int, Scope] = {}  # by id() of a statement's fields
        self._parents: dict[int, Scope] = {}  # a CTE's or subquery's, set by its level
        self._columns: set[tuple[int, str]] = set()  # (id of a source, column)

    def scope_of(self, kind: str, fields: Fields, around: Scope) -> Scope:
        """The scope of a statement's level: made once, inside the scope given for it by the
        level that names it (a CTE's WITH, a subquery's FROM), else inside `around`."""
        made = self._scopes.get(id(fields))
        if made is not None:
            return made
        with_scope = Scope(self._parents.get(id(fields), around), ctes_of(fields))
        for cte in with_scope.ctes.values():
            if (query := node(cte.get("ctequery"))) is not None:
                self._parents[id(query[1])] = with_scope  # a CTE sees its WITH, not the FROM
        scope = Scope(with_scope)
        scope.sources = [
            self._source(item, with_scope, scope)
            for name in _FROM.get(kind, ())
            for item in from_items(fields.get(name))
        ]
        self._scopes[id(fields)] = scope
        return scope

    def _source(self, item: tuple[str, Fields], with_scope: Scope, scope: Scope) -> _Source:
        kind, fields = item
        alias = fields.get("alias")
        alias_fields = alias if isinstance(alias, dict) else {}
        alias_name = alias_fields.get("aliasname")
        named = alias_name if isinstance(alias_name, str) else None
        columns = string_names(alias_fields.get("colnames"))
        if kind == "RangeSubselect" and (query := node(fields.get("subquery"))) is not None:
            # Only a LATERAL subquery sees the FROM items before it.
            around = scope if fields.get("lateral") else with_scope
            self._parents[id(query[1])] = around
            return _Source(named, around, columns, query)
        if kind == "RangeFunction":
            # Its calls see the FROM items before it, as a LATERAL subquery does.
            functions = tuple(range_functions(fields))
            name = named or name_of(functions[0] if functions else None)
            columns = columns or function_columns(name, functions)
            return _Source(name, scope, columns, functions=functions)
        relname = fields.get("relname")
        if kind != "RangeVar" or not isinstance(relname, str):
            return _Source(named, scope)  # a table function, XMLTABLE...: columns unknown
        cte = scope.cte(relname) if fields.get("schemaname") is None else None
        if cte is not None and (query := node(cte[0].get("ctequery"))) is not None:
            given = string_names(cte[0].get("aliascolnames"))
            return _Source(named or relname, cte[1], columns or given, query)
        return _Source(named or relname, scope)

    def resolve(self, reference: Fields, scope: Scope) -> list[Value]:
        """What a column reference names, found as the server finds it: a qualified one in
        the nearest level with a FROM item of that name, an unqualified one in the nearest
        level with a column of that name. A level with a table whose columns are unknown
        ends an unqualified search: the name may be that table's."""
        parts = [string(part) for part in as_list(reference.get("fields"))]
        names = [part for part in parts if part is not None]
        if not names or len(names) != len(parts):
            return []  # a star, or something odd
        column, qualifier = names[-1], (names[-2] if len(names) > 1 else None)
        at: Scope | None = scope
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

    def _columns_of(self, sources: list[_Source], column: str) -> list[Value]:
        """The expressions that give a column of these FROM items, each item's column
        resolved once in the statement."""
        found: list[Value] = []
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
                found += self.output(source.query, scope, source.columns, name=column)
        return found

    def output(
        self,
        query: tuple[str, Fields],
        scope: Scope,
        columns: tuple[str, ...],
        *,
        name: str | None = None,
        position: int | None = None,
    ) -> list[Value]:
        """The expressions of a query's output column, by name (after the alias's `columns`)
        or position, in every branch of a set operation and every row of a VALUES, each with
        its level's scope."""
        leaves = list(self._leaves(query, scope))
        first, first_scope = leaves[0]
        row = next(iter(output_rows(first)), [])
        if any(is_star(value) for _, value in row):
            # A star passes its level's columns through in an order the tree does not say:
            # a column is found by its name only, among those written or through the star.
            if name is None or name in columns:
                return []
            written = [value for given, value in row if given == name]
            return [(written[0] if written else column_reference(name), first_scope)]
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
            for each in output_rows(leaf)
            if position < len(each)
        ]

    def _leaves(self, query: tuple[str, Fields], scope: Scope) -> Iterator[tuple[Fields, Scope]]:
        """The levels that give a query's rows, left to right: the branches of a set
        operation (each a SELECT or VALUES of its own), else the query itself."""
        kind, fields = query
        if kind != SELECT:
            yield {"returning": returning_list(fields)}, scope
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
