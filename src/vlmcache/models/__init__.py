"""Small real models for tests and benchmarks (see tiny_vqa)."""

from .tiny_vqa import IMAGE_TOKEN, build_tiny_vqa, make_prompt

__all__ = ["IMAGE_TOKEN", "build_tiny_vqa", "make_prompt"]
