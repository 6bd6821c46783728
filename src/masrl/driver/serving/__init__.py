"""Serving: the OpenAI-compatible gateway (`gateway`, its wire format `wire`) and `masrl serve`."""
