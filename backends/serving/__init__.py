"""One OpenAI-compatible server that looks exactly like vLLM on the wire.

Plug a `TokenGenerator` into `create_openai_app`; the app writes vLLM's JSON,
SSE and `vllm:*` metrics. Used by the pool simulator, the bundled engine and
the test fakes.
"""

from backends.serving.answers import ResponseBuilder, error_body, sse
from backends.serving.app import create_openai_app
from backends.serving.generation import Delta, GenerationRequest, TokenGenerator
from backends.serving.metrics import VllmMetrics
from backends.serving.parsing import ProtocolError

__all__ = [
    "Delta",
    "GenerationRequest",
    "ProtocolError",
    "ResponseBuilder",
    "TokenGenerator",
    "VllmMetrics",
    "create_openai_app",
    "error_body",
    "sse",
]
