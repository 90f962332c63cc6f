"""Load YAML while remembering the line of every key and item.

`load_with_lines(text)` returns the plain Python data and a map from a path
(a tuple of keys and list indices, as pydantic reports locations) to the
1-based line it starts on, so validation errors can say `file:line`.
Duplicate keys are an error here: PyYAML silently keeps the last one.

A policy is small and written by hand, so the loader is bounded: text over
`MAX_BYTES` and nesting deeper than `MAX_DEPTH` are refused before anything
is built, and YAML aliases (`*a`, which a dumper writes for a repeated
value) may expand to `MAX_NODES` values in all, no more: an alias bomb, a
kilobyte that expands into gigabytes, is refused when it passes the bound.
`read_text` reads a file no further than the byte limit.
"""

from __future__ import annotations

from typing import Any

import yaml

Path = tuple[Any, ...]
MAX_BYTES = 1 << 20  # 1 MiB: a policy is a page or two
MAX_DEPTH = 64  # mappings and lists inside each other
MAX_NODES = 100_000  # values in all, aliases expanded


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def read_bytes(path: str, limit: int = MAX_BYTES) -> bytes:
    """The file's bytes, read no further than one past `limit`."""
    with open(path, "rb") as file:
        return file.read(limit + 1)


def decode(data: bytes, limit: int = MAX_BYTES) -> str:
    """What `read_bytes` read, as text; YamlError when the file was over `limit`."""
    if len(data) > limit:
        raise YamlError(1, f"the file is over the {limit} byte limit")
    return data.decode("utf-8")


def read_text(path: str, limit: int = MAX_BYTES) -> str:
    """The file's text, read no further than `limit` bytes; YamlError past it."""
    return decode(read_bytes(path, limit), limit)


class _BoundedLoader(yaml.SafeLoader):
    """Composes nodes as SafeLoader does, refusing deep nesting as it comes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in PyYAML's stubs
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise YamlError(event.start_mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_with_lines(text: str) -> tuple[Any, dict[Path, int]]:
    if len(text) > MAX_BYTES or len(text.encode("utf-8")) > MAX_BYTES:
        raise YamlError(1, f"the policy is over the {MAX_BYTES} byte limit")
    try:
        node = yaml.compose(text, Loader=_BoundedLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlError(mark.line + 1 if mark else 1, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlError(1, f"invalid YAML: {exc}") from None
    lines: dict[Path, int] = {}
    if node is None:
        return None, lines
    return _Converter(lines).convert(node, ()), lines


class _Converter:
    def __init__(self, lines: dict[Path, int]) -> None:
        self.lines = lines
        self.loader = yaml.SafeLoader("")
        self.nodes = 0

    def convert(self, node: yaml.Node, path: Path) -> Any:
        """An alias is the node it names, met again: each meeting counts."""
        self.nodes += 1
        if self.nodes > MAX_NODES or len(path) > MAX_DEPTH:
            bound = f"over {MAX_NODES} values" if self.nodes > MAX_NODES else f"nested deeper than {MAX_DEPTH} levels"
            raise YamlError(node.start_mark.line + 1, f"{bound} once its aliases are expanded")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node)

    def _scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node)
        except yaml.YAMLError as exc:
            raise YamlError(node.start_mark.line + 1, f"invalid value: {exc}") from None

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlError(line, "mapping keys must be plain values")
            key = self._scalar(key_node)
            if key in result:
                raise YamlError(line, f"duplicate key {key!r}")
            key_path = (*path, key)
            self.lines[key_path] = line
            result[key] = self.convert(value_node, key_path)
        return result
