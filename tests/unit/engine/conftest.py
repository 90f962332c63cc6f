import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def smollm():
    """The default model (SmolLM2-135M-Instruct, float32), loaded once."""
    from backends.engine.loading import load_model

    try:
        return load_model("default")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
