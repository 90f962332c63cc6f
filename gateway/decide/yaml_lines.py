"""Load YAML while remembering the line of every key and item.

`load_with_lines(text)` returns the plain Python data and a map from a path
(a tuple of keys and list indices, as pydantic reports locations) to the
1-based line it starts on, so validation errors can say `file:line`.
Duplicate keys are an error here: PyYAML silently keeps the last one.
"""

from __future__ import annotations

from typing import Any

import yaml

Path = tuple[Any, ...]


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def load_with_lines(text: str) -> tuple[Any, dict[Path, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
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

    def convert(self, node: yaml.Node, path: Path) -> Any:
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
