"""Reading a YAML file without trusting it: size, encoding, nesting depth, alias expansion and
duplicate keys are checked before anything is built from it. Every file the exporter reads
(configuration, web configuration, alert thresholds) comes through here."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import yaml

from .schema import ConfigError, location

# A 10,000-target fleet file is about 1.5 MB, while a 50 MB file took a minute and half a
# gigabyte to load: a reload would hold up the exporter that long for a file that is a mistake.
MAX_FILE_BYTES = 8 * 1024 * 1024
# The schema nests six levels deep. The pure-Python parser recurses per level, so without a
# bound a deeply nested file would end in a RecursionError instead of a message.
MAX_NESTING = 64
# An alias repeats the node it names. The loader shares that node, but validation walks it
# once per alias: nine levels of ten aliases each ("billion laughs") would take a billion
# steps. Aliases may repeat shared settings across a fleet: twenty times the 50,000 values of
# a file of 10,000 targets' names and DSNs is far beyond that.
MAX_EXPANDED_NODES = 1_000_000
# libyaml's parser is several times faster on a big fleet; the pure-Python one is the fallback
# for a PyYAML built without it.
_LOADER: type[yaml.CSafeLoader] | type[yaml.SafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)


def _read_text(path: Path, what: str) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)  # no more, whatever the file turns out to be
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; is this the {what}?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


class _Mark(Protocol):
    line: int
    column: int


def _at(mark: _Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"


def _check_nesting(text: str, path: Path) -> None:
    """Refuse nesting deeper than MAX_NESTING, from the parser's events: they need no recursion."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise ConfigError(
                    f"{path}: {_at(event.start_mark)}: nested more than {MAX_NESTING} levels deep"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node, path: Path) -> None:
    """Refuse aliases that expand the document past MAX_EXPANDED_NODES, or into itself.

    Each distinct list or mapping is sized once (its size counts its children's as often as
    they are named), so a bomb is measured in as many steps as it has written nodes. A
    value (scalar) counts one wherever it is: only the pushes of lists and mappings cost.
    """
    size: dict[int, int] = {}
    walking: set[int] = set()  # the collections whose descendants are being sized
    aliased = False  # without aliases, MAX_FILE_BYTES bounds the document already
    # A node, then again with its children once they are sized.
    pending: list[tuple[yaml.Node, list[yaml.Node] | None]] = [(root, None)]
    while pending:
        node, sized = pending.pop()
        if sized is not None:
            walking.discard(id(node))
            size[id(node)] = 1 + sum(size.get(id(child), 1) for child in sized)
            continue
        if id(node) in size:
            aliased = True
            continue
        if id(node) in walking:
            raise ConfigError(f"{path}: {_at(node.start_mark)}: an alias names a node holding it")
        walking.add(id(node))
        children = _children(node)
        pending.append((node, children))
        pending.extend((c, None) for c in children if isinstance(c, yaml.CollectionNode))
    expanded = size.get(id(root), 1)
    if aliased and expanded > MAX_EXPANDED_NODES:
        raise ConfigError(
            f"{path}: aliases expand the document to {expanded:,} values, "
            f"more than {MAX_EXPANDED_NODES:,}"
        )


def _check_unique_keys(root: yaml.Node, path: Path) -> None:
    """Refuse a mapping that gives a key twice, which YAML loaders resolve silently."""
    seen: set[int] = set()  # an alias refers to a node again: walk it once
    pending: list[tuple[yaml.Node, tuple[int | str, ...]]] = [(root, ())]
    while pending:
        node, at = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, (*at, i)) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            # A key that is a list or a mapping is refused when the document is built.
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                line = key.start_mark.line + 1
                if key.value in lines:
                    raise ConfigError(
                        f"{path}: {location(at)}: key {key.value!r} is given twice "
                        f"(lines {lines[key.value]} and {line})"
                    )
                lines[key.value] = line
                pending.append((value, (*at, key.value)))


def _parse(text: str, path: Path) -> object:
    try:
        _check_nesting(text, path)
        loader = _LOADER(text)
        try:
            root = loader.get_single_node()
            if root is None:  # an empty file
                return None
            _check_expansion(root, path)
            _check_unique_keys(root, path)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        # Not str(exc): the pure-Python parser quotes the line, which may hold a password.
        problem = exc.problem or exc.context
        raise ConfigError(f"{path}: not valid YAML: {_at(exc.problem_mark)}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def read_yaml(path: Path, what: str = "configuration file") -> object:
    """The document in the file at `path`; ConfigError, naming the file, if it cannot be one.

    `what` names the kind of file in the messages that cannot say where in it the problem is.
    """
    return _parse(_read_text(path, what), path)
