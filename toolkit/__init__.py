"""LLM deployment toolkit: build, serve and measure Triton model repositories."""

__version__ = "0.1.0"
