"""Serving calls: the engine, prompt rendering, the buffer of served calls, logprobs."""
