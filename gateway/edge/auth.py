"""Optional client API keys.

Keys come from the environment (`SPECGATE_API_KEYS="key1,key2:standard+eagle"`)
or a file (`SPECGATE_API_KEYS_FILE`, YAML or JSON: a list of
`{key: ..., pools: [...], priority: N, max_priority: M}`), never from the
policy. A key may be limited to some pools. A file's key may set its
requests' priority (`priority`, 0 unset) and the most its clients may claim
with the `x-specgate-priority` header (`max_priority`, unset: `priority`);
see docs/priorities.md. Keys are kept only as SHA-256 digests, looked up by digest, so a
comparison costs the same whatever the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.errors import Unauthorized
from gateway.policy.priority import HIGHEST, LOWEST


@dataclass(frozen=True)
class Grant:
    pools: frozenset[str] | None  # None: every pool
    priority: int = 0  # its requests' priority, unless a rule or the header says otherwise
    max_priority: int | None = None  # the most the header may claim; None: `priority`

    @property
    def cap(self) -> int:
        return self.priority if self.max_priority is None else max(self.max_priority, self.priority)

    def allows(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools


class ClientKeys:
    def __init__(self, grants: Mapping[str, Grant]) -> None:
        self._by_digest = {_digest(key): grant for key, grant in grants.items()}

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def authenticate(self, authorization: str | None, api_key_header: str | None = None) -> Grant:
        key = api_key_header
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer":
                key = value.strip()
        grant = self._by_digest.get(_digest(key)) if key else None
        if grant is None:
            raise Unauthorized("a valid API key is required (Authorization: Bearer <key>)")
        return grant

    @classmethod
    def load(cls, spec: str | None, path: Path | None) -> ClientKeys:
        grants: dict[str, Grant] = {}
        for item in (spec or "").split(","):
            key, _, pools = item.strip().partition(":")
            if key:
                grants[key] = Grant(frozenset(pools.split("+")) if pools else None)
        if path is not None:
            grants.update(_from_file(path))
        return cls(grants)


def _from_file(path: Path) -> dict[str, Grant]:
    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    except OSError as exc:
        raise ValueError(f"SPECGATE_API_KEYS_FILE {path}: cannot read it: {exc.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"SPECGATE_API_KEYS_FILE {path}: not a YAML or JSON list: {exc}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of {{key, pools, priority, max_priority}} entries")
    grants = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            raise ValueError(f"{path}: entry {i} needs a string 'key'")
        pools = entry.get("pools")
        grants[entry["key"]] = Grant(frozenset(_strings(pools, path, i)) if pools else None,
                                     _priority(entry, "priority", path, i) or 0,
                                     _priority(entry, "max_priority", path, i))
    return grants


def _priority(entry: dict[str, object], name: str, path: Path, i: int) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not LOWEST <= value <= HIGHEST:
        raise ValueError(f"{path}: entry {i}: '{name}' must be an integer from {LOWEST} to {HIGHEST}")
    return value


def _strings(values: object, path: Path, i: int) -> Iterable[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{path}: entry {i}: 'pools' must be a list of pool names")
    return values


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
