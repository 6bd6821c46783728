"""Import a user's object named ``'module:attr'`` from a config (workflows, rewards, estimators)."""

from __future__ import annotations

import importlib
import re

from masrl.errors import ConfigError

_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def load_object(ref: str, what: str):
    """Import ``module:attr``; every way it can fail (a malformed name, a module that is missing, does not
    compile or raises as it is imported, a missing attribute) is a ``ConfigError`` naming the config key
    (``what``), with the module's own message and what to fix."""
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(f"{what} '{ref}' is not registered; use a registered name or 'module:attr'")
    mod_name, attr = ref.split(":", 1)
    if not _DOTTED.match(mod_name) or not _DOTTED.match(attr):
        raise ConfigError(f"{what} '{ref}': write an absolute module path and an attribute, 'package.module:Name' "
                          f"(no empty part, no leading dot)")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{what} '{ref}': cannot import module '{mod_name}' ({exc})") from None
    except SyntaxError as exc:
        raise ConfigError(f"{what} '{ref}': module '{mod_name}' does not compile: {exc.msg} ({exc.filename}, line "
                          f"{exc.lineno})") from None
    except Exception as exc:  # the module's own code raised as it was imported: say what
        raise ConfigError(f"{what} '{ref}': importing module '{mod_name}' raised {type(exc).__name__}: "
                          f"{str(exc)[:300]}") from None
    obj = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{what} '{ref}': module '{mod_name}' has no attribute '{attr}'") from None
    return obj


def build_object(factory, what: str, *args, **kwargs):
    """``factory(*args, **kwargs)`` for a user's plugin; its failure is a ``ConfigError`` naming the key
    (``what``) and the plugin's own message, never a raw traceback."""
    try:
        return factory(*args, **kwargs)
    except ConfigError:
        raise
    except TypeError as exc:
        raise ConfigError(f"{what}: cannot build it with {', '.join(kwargs) or 'no arguments'}: {exc}") from None
    except Exception as exc:  # the plugin's own code raised while it was built
        raise ConfigError(f"{what}: building it raised {type(exc).__name__}: {str(exc)[:300]}") from None


MAX_YAML_NODES = 200_000  # values a YAML document may stand for once its aliases are expanded


def read_yaml(text: str, where: str):
    """``yaml.safe_load`` of a config or graph, refused when its aliases make it stand for more than
    ``MAX_YAML_NODES`` values (a 1 KB "billion laughs" document is a handful of anchors, each a list of the
    one before: PyYAML shares them, but everything that walks the result walks every expansion)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    size = expanded_size(data, MAX_YAML_NODES)
    if size > MAX_YAML_NODES:
        raise ConfigError(f"{where}: its aliases expand to more than {MAX_YAML_NODES:,} values (a YAML alias "
                          f"bomb?); write the values out, or use fewer nested anchors")
    return data


def expanded_size(value, limit: int) -> int:
    """How many values ``value`` stands for with every shared (aliased) part counted each time it appears;
    stops counting past ``limit``. Linear in the distinct objects (each one's size is counted once)."""
    memo: dict[int, int] = {}

    def size(v, depth: int) -> int:
        if depth > 200:
            return limit + 1
        if not isinstance(v, (dict, list)):
            return 1
        key = id(v)
        if key in memo:
            return memo[key]
        memo[key] = limit + 1  # a value that contains itself expands without end
        items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
        total = 1
        for k, x in items:
            total += (0 if k is None else 1) + size(x, depth + 1)
            if total > limit:
                break
        memo[key] = min(total, limit + 1)
        return memo[key]

    return size(value, 0)
