"""Fake tensorrt_llm for tests: only __version__, and the banner the real package prints on import."""

import os

__version__ = os.environ.get("FAKE_TRTLLM_VERSION", "0.20.0")
print(f"[TensorRT-LLM] TensorRT-LLM version: {__version__}")
