"""Reading a YAML file without trusting it: size, encoding, nesting depth, alias expansion and
duplicate keys are checked before anything is built from it. Every file the exporter reads
(configuration, web configuration, alert thresholds) comes through here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .validation import ConfigError, describe_error, item_name, location, step

M = TypeVar("M", bound=BaseModel)

# A 10,000-target fleet file is about 1.5 MB, while a 50 MB file took a minute and half a
# gigabyte to load: a reload would hold up the exporter that long for a file that is a mistake.
MAX_FILE_BYTES = 8 * 1024 * 1024
# The schema nests six levels deep. The pure-Python parser recurses per level, so without a
# bound a deeply nested file would end in a RecursionError instead of a message.
MAX_NESTING = 64
# An alias repeats the node it names. The loader shares that node, but validation builds a
# value per use: 2,000 uses of a 200-key mapping, an 18 KB file, took 580 MB to refuse. So the
# document may hold at most EXPANSION_FACTOR times the values written in the file (or
# EXPANSION_FLOOR, for a small file that shares a block widely): shared settings named by
# every target of a fleet stay far below, and no file costs more than a few times what the
# same file without aliases would.
EXPANSION_FACTOR = 10
EXPANSION_FLOOR = 20_000
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


class _Expansion:
    """What the parser's events say of a document's nesting and of what its aliases expand
    to. A value written counts one (a scalar, an alias, a list or a mapping); the document
    counts each alias as the values of the node it names, sized once when that node ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The open lists and mappings: their values so far, anchor and where they start.
        self.opened: list[tuple[list[int], str | None, _Mark | None]] = []
        self.sizes: dict[str, int] = {}  # the anchored nodes that have ended
        self.written = self.expanded = 0
        self.biggest: tuple[int, _Mark | None] = (0, None)  # the alias repeating the most

    def start(self, event: yaml.CollectionStartEvent) -> None:
        self.written += 1
        if len(self.opened) == MAX_NESTING:
            where = _at(event.start_mark)
            raise ConfigError(f"{self.path}: {where}: nested more than {MAX_NESTING} levels deep")
        self.opened.append(([1], event.anchor, event.start_mark))

    def end(self) -> None:
        [size], anchor, _ = self.opened.pop()
        if anchor is not None:
            self.sizes[anchor] = size
        self._add(size)

    def alias(self, event: yaml.AliasEvent) -> None:
        self.written += 1
        for _, anchor, mark in self.opened:
            if anchor is not None and anchor == event.anchor:
                raise ConfigError(f"{self.path}: {_at(mark)}: an alias names a node holding it")
        size = self.sizes.get(event.anchor or "", 1)  # an unknown one is the composer's error
        self.biggest = max(self.biggest, (size, event.start_mark), key=lambda found: found[0])
        self._add(size)

    def scalar(self, event: yaml.ScalarEvent) -> None:
        self.written += 1
        if event.anchor is not None:
            self.sizes[event.anchor] = 1
        self._add(1)

    def _add(self, size: int) -> None:
        if self.opened:
            self.opened[-1][0][0] += size
        else:
            self.expanded += size

    def check_limit(self) -> None:
        limit = max(EXPANSION_FACTOR * self.written, EXPANSION_FLOOR)
        if self.expanded > limit:
            size, mark = self.biggest
            raise ConfigError(
                f"{self.path}: {_at(mark)}: aliases expand the {self.written:,} values written "
                f"to {self.expanded:,}, more than {limit:,} (the larger of {EXPANSION_FACTOR} "
                f"times those written and {EXPANSION_FLOOR:,}); the alias here repeats {size:,}"
            )


def _check_events(text: str, path: Path) -> None:
    """Refuse nesting deeper than MAX_NESTING, an alias inside the node it names, and aliases
    that expand the document past its limit, from the parser's events: they need no
    recursion, and nothing of the document is composed or built yet."""
    counted = _Expansion(path)
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            counted.start(event)
        elif isinstance(event, yaml.CollectionEndEvent):
            counted.end()
        elif isinstance(event, yaml.AliasEvent):
            counted.alias(event)
        elif isinstance(event, yaml.ScalarEvent):
            counted.scalar(event)
        # the stream's and documents' starts and ends count for nothing
    counted.check_limit()


def _node_name(node: yaml.Node) -> str | None:
    """The `name` a mapping's node gives itself (a target's), before anything is built."""
    if not isinstance(node, yaml.MappingNode):
        return None
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "name":
            return item_name({"name": value.value if isinstance(value, yaml.ScalarNode) else None})
    return None


def _check_unique_keys(root: yaml.Node, path: Path) -> None:
    """Refuse a mapping that gives a key twice, which YAML loaders resolve silently."""
    seen: set[int] = set()  # an alias refers to a node again: walk it once
    pending: list[tuple[yaml.Node, str]] = [(root, "")]
    while pending:
        node, at = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend(
                (item, step(at, i, _node_name(item))) for i, item in enumerate(node.value)
            )
        elif isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            # A key that is a list or a mapping is refused when the document is built.
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    continue
                line = key.start_mark.line + 1
                if key.value in lines:
                    raise ConfigError(
                        f"{path}: {at or '(top level)'}: key {key.value!r} is given twice "
                        f"(lines {lines[key.value]} and {line})"
                    )
                lines[key.value] = line
                pending.append((value, step(at, key.value)))


def _parse(text: str, path: Path) -> object:
    try:
        _check_events(text, path)
        loader = _LOADER(text)
        try:
            root = loader.get_single_node()
            if root is None:  # an empty file
                return None
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


def _no_document(path: Path, what: str) -> object:
    raise ConfigError(f"{path}: the {what} is empty")


def read_model(
    path: Path,
    model: type[M],
    *,
    what: str = "configuration file",
    expected: str = "a mapping",
    if_empty: Callable[[], object] | None = None,
    problem: Callable[[Mapping[str, Any]], str] = describe_error,
) -> M:
    """The file at `path` read as `model`: a ConfigError names the file and, for each thing
    wrong, where in the file it is (`FILE: targets[1] (billing).dsn: ...`, a named item of a
    list by its position and name) and `problem`'s words for
    it. An empty file is what `if_empty` gives (or raises), else an error."""
    data = read_yaml(path, what)
    if data is None:
        data = _no_document(path, what) if if_empty is None else if_empty()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: (top level): expected {expected}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(f"{path}: {location(e['loc'], data)}: {problem(e)}" for e in exc.errors())
        ) from None
