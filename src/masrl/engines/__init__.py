"""Rollout engines (HF now; vLLM and OpenAI-compatible servers later) and the per-worker batcher."""
