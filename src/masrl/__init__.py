"""masrl: train LLM-based multi-agent systems with reinforcement learning."""

__version__ = "0.1.0"
