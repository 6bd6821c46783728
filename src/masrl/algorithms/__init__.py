"""Advantage estimators (registered by name in ``estimators``) and losses: pure tensor functions.

This package's ``__init__`` imports nothing, so ``algorithms.estimators`` (the registry) stays
importable without torch.
"""
