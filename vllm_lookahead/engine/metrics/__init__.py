"""Counters and stats: worker -> scheduler (vLLM spec-decode stats) -> API server (Prometheus)."""
