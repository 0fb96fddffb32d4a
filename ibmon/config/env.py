"""``IBMON_*`` environment variables as the nested settings dict they stand for.

``IBMON_<KEY>`` sets a top-level key and ``IBMON_<SECTION>__<KEY>`` a key of a section (names in
any case). A value meant for a section, a list or a table (``IBMON_SOURCES``,
``IBMON_PROMETHEUS``, ``IBMON_MQTT__TLS``) is JSON; every other value stays a string and the
settings model converts it, so ``IBMON_MQTT__PORT=8883`` is checked exactly like ``port = 8883``.

This used to be pydantic-settings. Reading the environment is the only thing ibmon took from it,
and importing it costs a compute-node daemon about 8 MB of its 40 MB budget, so the rule lives
here instead, with the same precedence: flags over environment over file, merged key by key.

A few ``IBMON_*`` variables belong to ibmon's commands, not to its settings (``NOT_SETTINGS``):
``IBMON_PASSWORD`` is the password ``top --url``, ``explain`` and ``topology`` send to a daemon,
and ``IBMON_TOOL_SCOPE`` marks the processes a diags tool started. Exporting one of them must not
stop ``run``, ``demo``, ``scan`` or ``check-config``, so the settings loader skips them.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = [
    "ENV_NESTING",
    "ENV_PREFIX",
    "NOT_SETTINGS",
    "PASSWORD_ENV",
    "EnvJsonError",
    "deep_merge",
    "environment_tree",
    "is_setting_variable",
    "section_model",
]

ENV_PREFIX = "IBMON_"
ENV_NESTING = "__"
#: The basic auth password of the API client commands (``ibmon.cli.apiclient``), never a setting.
PASSWORD_ENV = "IBMON_PASSWORD"  # noqa: S105 - the variable's name, not a password
#: ``IBMON_*`` variables that are not settings: the settings loader ignores them.
NOT_SETTINGS = frozenset({PASSWORD_ENV, "IBMON_TOOL_SCOPE"})

_COMPLEX = (list, dict, set, frozenset, tuple)


class EnvJsonError(ValueError):
    """A variable meant for a section, list or table whose value is not JSON (or is JSON nested
    deeper than the parser allows: ``cause`` then says so)."""

    def __init__(self, name: str, cause: json.JSONDecodeError | str) -> None:
        super().__init__(f"{name}: {cause}")
        self.name = name
        self.cause = cause


def is_setting_variable(name: str) -> bool:
    """Whether environment variable ``name`` is one the settings loader reads (``IBMON_*``,
    any case, except ``NOT_SETTINGS``)."""
    upper = name.upper()
    return upper.startswith(ENV_PREFIX) and upper not in NOT_SETTINGS


def _members(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of ``X | None``/``Optional[X]``/``Annotated[X, ...]``, else ``(X,)``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return tuple(m for a in get_args(annotation) for m in _members(a) if m is not type(None))
    return (annotation,)


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The settings section a field holds, when it holds one (possibly optional)."""
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _is_complex(annotation: Any) -> bool:
    return any(
        (isinstance(m, type) and issubclass(m, BaseModel)) or get_origin(m) in _COMPLEX
        or m in _COMPLEX
        for m in _members(annotation)
    )


def _leaf_is_json(model: type[BaseModel] | None, path: list[str]) -> bool:
    """Whether the field at ``path`` (below ``model``) takes JSON; unknown keys do not (the
    model refuses them by name, which is the clearer error)."""
    for depth, part in enumerate(path):
        if model is None:
            return False
        field = model.model_fields.get(part)
        if field is None:
            return False
        if depth == len(path) - 1:
            return _is_complex(field.annotation)
        model = section_model(field.annotation)
    return False


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top: tables merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, Mapping):
            merged[key] = deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def environment_tree(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the ``IBMON_*`` variables of ``environ`` set, as a nested dict.

    A section set whole (``IBMON_PROMETHEUS='{...}'``) is merged with keys set one by one
    (``IBMON_PROMETHEUS__LISTEN``), the single keys winning. Raises ``EnvJsonError`` naming the
    variable whose JSON does not parse. ``NOT_SETTINGS`` are skipped.
    """
    paths: list[tuple[list[str], str, str]] = []
    for name, text in environ.items():
        if is_setting_variable(name):
            paths.append((name[len(ENV_PREFIX):].lower().split(ENV_NESTING), name, text))
    tree: dict[str, Any] = {}
    for path, name, raw in sorted(paths, key=lambda p: (len(p[0]), p[1])):
        value: Any = raw
        if _leaf_is_json(model, path):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise EnvJsonError(name, exc) from None
            except RecursionError:
                raise EnvJsonError(name, "nested deeper than the JSON parser allows") from None
        layer: dict[str, Any] = {path[-1]: value}
        for part in reversed(path[:-1]):
            layer = {part: layer}
        tree = deep_merge(tree, layer)
    return tree
