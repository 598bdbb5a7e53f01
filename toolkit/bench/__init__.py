"""Measurement: perf_analyzer sweeps with LLM metrics, and the serving stack's own CPU cost."""
