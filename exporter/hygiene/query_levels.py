"""One level of a query as the parse tree gives it: its CTEs, FROM items, rows and column names."""

from __future__ import annotations

from collections.abc import Iterator

from .parse_tree import ARMS, NO_SET_OPERATION, SELECT, Fields, as_list, node, string

# A level's output row: each column's name (None where it is not known) and the expression
# that computes it.
Row = list[tuple[str | None, object]]


def string_names(value: object) -> tuple[str, ...]:
    """The names of a list of String nodes (an alias's columns, a CTE's)."""
    return tuple(name for name in map(string, as_list(value)) if name is not None)


def ctes_of(fields: Fields) -> dict[str, Fields]:
    """A statement's CTEs (their CommonTableExpr fields) by name, from its WITH."""
    clause = fields.get("withClause")
    ctes: dict[str, Fields] = {}
    for item in as_list(clause.get("ctes") if isinstance(clause, dict) else None):
        found = node(item)
        if found is not None and isinstance(name := found[1].get("ctename"), str):
            ctes[name] = found[1]
    return ctes


def from_items(value: object) -> Iterator[tuple[str, Fields]]:
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


def range_functions(fields: Fields) -> Iterator[object]:
    """A RangeFunction's calls (each in a List with its column definitions)."""
    for item in as_list(fields.get("functions")):
        found = node(item)
        items = as_list(found[1].get("items")) if found is not None else []
        if items:
            yield items[0]


def function_columns(name: str | None, functions: tuple[object, ...]) -> tuple[str, ...]:
    """The columns of functions in FROM without an alias's: one function's is the item's
    name (its alias, else its own), several functions' theirs."""
    if len(functions) == 1:
        return (name,) if name else ()
    return tuple(n for n in map(name_of, functions) if n)


def column_reference(name: str) -> object:
    """A reference to a column by its name alone, as a star at a level stands for."""
    return {"ColumnRef": {"fields": [{"String": {"sval": name}}]}}


def first_row(query: tuple[str, Fields]) -> Row:
    """The output of a query's first branch (a set operation's columns are named by it)."""
    kind, fields = query
    if kind != SELECT:
        return output_rows({"returning": returning_list(fields)})[0]
    while fields.get("op", NO_SET_OPERATION) != NO_SET_OPERATION:
        left = fields.get(ARMS[0])
        if not isinstance(left, dict):
            return []
        fields = left
    return next(iter(output_rows(fields)), [])


def output_rows(level: Fields) -> list[Row]:
    """A level's output rows as (column name, expression): a SELECT's one target list, each
    row of a VALUES, a data-changing statement's RETURNING."""
    if "returning" in level:
        return [[_target(item) for item in as_list(level["returning"])]]
    values = as_list(level.get("valuesLists"))
    if values:
        rows: list[Row] = []
        for row in values:
            found = node(row)
            items = as_list(found[1].get("items")) if found else []
            rows.append([(f"column{i + 1}", item) for i, item in enumerate(items)])
        return rows
    return [[_target(item) for item in as_list(level.get("targetList"))]]


def returning_list(fields: Fields) -> list[object]:
    """A data-changing statement's RETURNING items."""
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
    return (name if isinstance(name, str) else name_of(value)), value


def is_star(value: object) -> bool:
    """Whether an output column is a star: `*` or `t.*`."""
    found = node(value)
    return (
        found is not None
        and found[0] == "ColumnRef"
        and any(node(part) == ("A_Star", {}) for part in as_list(found[1].get("fields")))
    )


def name_of(value: object) -> str | None:
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
        inner = name_of(fields.get("arg"))
        if inner is not None:
            return inner
        type_name = fields.get("typeName")
        names = as_list(type_name.get("names")) if isinstance(type_name, dict) else []
        return string(names[-1]) if names else None
    return None
