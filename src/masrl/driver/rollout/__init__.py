"""Rollouts: the controller that runs workflows and routes rewards, the workflow context, the
per-host batcher and the tools' back-ends."""
