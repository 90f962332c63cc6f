"""Test doubles that talk real HTTP on 127.0.0.1."""

from tests.fakes.faults import RecordedRequest
from tests.fakes.process import FakeVllmProcess
from tests.fakes.vllm import Disconnect, FakeVllm, Script

__all__ = ["Disconnect", "FakeVllm", "FakeVllmProcess", "RecordedRequest", "Script"]
