"""vLLM launch profiles (profiles.yaml) and the launcher that renders them."""

from backends.vllm.profiles import Profile, load_profiles, render

__all__ = ["Profile", "load_profiles", "render"]
