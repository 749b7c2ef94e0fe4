"""Tests of whole pipelines that must learn: CPU, vision, GPU (marked) and vLLM (marked)."""
