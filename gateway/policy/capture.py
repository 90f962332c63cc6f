"""The policy's `capture` section: sample production prompts for draft training.

Off by default. When on, a `share` of chat and completion requests hand their
prompt messages and traffic class to the gateway's capture stage, which scrubs
PII and secrets and appends them to rotated JSONL files under `directory`
(see docs/drafts.md). Answers, headers and keys are never captured.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.policy.strict import Strict


class CaptureSpec(Strict):
    enabled: bool = False
    share: float = Field(default=0.01, ge=0, le=1)  # the fraction of requests sampled
    directory: str | None = None  # where the JSONL files go; required when enabled
    max_file_bytes: int = Field(default=16 * 2**20, ge=1024)  # a file rotates past this size
    max_files: int = Field(default=20, ge=1)  # the oldest files go past this count
    retention_days: float = Field(default=14, gt=0)  # files older than this are deleted
    queue: int = Field(default=1000, ge=1)  # prompts waiting to be scrubbed; more are dropped
    queue_bytes: int = Field(default=32 * 2**20, ge=1024)  # their text in all; more are dropped
    max_prompt_bytes: int = Field(default=256 * 2**10, ge=1024)  # a longer prompt is skipped, counted
    phone_region: str = Field(default="US", pattern=r"^[A-Z]{2}$")  # numbers without a country code

    @model_validator(mode="after")
    def _has_directory(self) -> CaptureSpec:
        if self.enabled and not self.directory:
            raise ValueError("capture.enabled needs capture.directory")
        return self
