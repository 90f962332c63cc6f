"""Process settings, from the environment (prefix SPECGATE_) or the CLI."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

STATE_URL_SCHEMES = ("redis://", "rediss://", "unix://")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PASSWORD_QUERY = re.compile(r"(?i)(password=)[^&#]*")


def redact_url(url: str) -> str:
    """The URL with its user and password (in the authority or the query) replaced by `***`."""
    url = _PASSWORD_QUERY.sub(r"\1***", url)
    if "@" not in url:
        return url
    scheme = _SCHEME.match(url)
    prefix = scheme.group(0) if scheme else ""
    return f"{prefix}:***@{url.rsplit('@', 1)[1]}"


def default_policy_path() -> Path:
    return Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECGATE_", extra="ignore")

    policy: Path = Field(default_factory=default_policy_path,
                         description="routing policy YAML file")
    host: str = "127.0.0.1"
    port: int = 8080
    admin_token: str | None = Field(default=None, repr=False)
    prometheus_url: str | None = None
    log_level: str = "info"

    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole request body must arrive within this
    max_header_bytes: int = 32 * 1024  # request line and headers, counted as they arrive (431 past it)
    max_headers: int = 100  # header lines; more get 431
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this
    # An idle client connection is closed after this: longer than clients keep theirs (httpx, and so the
    # openai and anthropic clients, 5 s), so the client closes first and never sends on a closing socket
    keep_alive_s: float = Field(default=75.0, gt=0)
    keepalive_s: float = 10.0
    write_timeout_s: float = 30.0  # one write to a client that stopped reading; at most the pool's total_s
    max_n: int = 16  # `n` and `best_of`
    max_output_tokens: int = 131072  # `max_tokens`, for a pool whose policy gives no max_model_len
    policy_watch_interval_s: float = 1.0
    flags_file: Path | None = None
    api_keys: str | None = Field(default=None, repr=False)  # "key1,key2:pool+pool"
    api_keys_file: Path | None = None
    drain_timeout_s: float = 30.0
    # Shared state: unset, one process decides alone. redis://, rediss:// or unix:// (Redis or Valkey).
    state_url: str | None = Field(default=None, repr=False)  # may carry a password
    state_namespace: str = "default"  # keys are specgate:{namespace}:..., so fleets can share a Redis
    state_timeout_s: float = 1.0  # one Redis command or connection attempt, in background tasks only
    state_start_wait_s: float = 2.0  # at start-up, how long to wait for the shared overrides
    # With a state URL one guard leads: a lease of this TTL, renewed (and tried by the others) this often
    guard_lease_ttl_s: float = Field(default=3.0, gt=0)
    guard_lease_renew_s: float = Field(default=1.0, gt=0)  # under the TTL; also how often followers re-read
    # OpenTelemetry traces, by OpenTelemetry's own variables (docs/tracing.md): on when an endpoint is set
    otel_endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    otel_traces_endpoint: str | None = Field(default=None, validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    otel_sdk_disabled: str = Field(default="", validation_alias="OTEL_SDK_DISABLED")  # "true" (any case): off
    otel_service_name: str = Field(default="specgate", validation_alias="OTEL_SERVICE_NAME")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:  # its message repeats each bad value: not a state URL's password
            raise _without_state_url_secrets(exc) from None

    @field_validator("policy", "flags_file", "api_keys_file", mode="before")
    @classmethod
    def _absolute(cls, path: str | Path | None, info: ValidationInfo) -> Path | None:
        """Made absolute once, against the working directory the settings load in: the
        process reads the same file however its working directory changes later. Not
        resolved: a symlink is kept, so that a mounted ConfigMap's swap is followed.
        An empty value is none (for the policy, the default policy)."""
        if path is None or str(path) == "":
            return default_policy_path() if info.field_name == "policy" else None
        return Path(path).absolute()

    @field_validator("state_url")
    @classmethod
    def _state_url_scheme(cls, url: str | None) -> str | None:
        """An empty URL is no URL (one process); any other must name a Redis or Valkey."""
        url = (url or "").strip()
        if url and not url.startswith(STATE_URL_SCHEMES):
            raise ValueError("SPECGATE_STATE_URL must start with redis://, rediss:// or unix:// "
                             "(a Redis or Valkey server)")
        return url or None


def _without_state_url_secrets(exc: ValidationError) -> ValidationError:
    """The same errors, with a refused state URL's user and password redacted; other values kept."""
    errors = exc.errors()
    if not any(error["loc"][:1] == ("state_url",) for error in errors):
        return exc  # nothing to redact (and not every error type can be rebuilt)
    for error in errors:
        if error["loc"][:1] == ("state_url",) and isinstance(error["input"], str):
            error["input"] = redact_url(error["input"])
    return ValidationError.from_exception_data(exc.title, errors)  # type: ignore[arg-type]  # errors() rows are line errors
