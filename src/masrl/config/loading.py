"""Import a user's object named ``'module:attr'`` from a config (workflows, rewards, estimators)."""

from __future__ import annotations

import importlib

from masrl.errors import ConfigError


def load_object(ref: str, what: str):
    """Import ``module:attr``; errors name the config key (``what``) and what to fix."""
    if ":" not in ref:
        raise ConfigError(f"{what} '{ref}' is not registered; use a registered name or 'module:attr'")
    mod_name, attr = ref.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{what} '{ref}': cannot import module '{mod_name}' ({exc})") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"{what} '{ref}': module '{mod_name}' has no attribute '{attr}'") from None
