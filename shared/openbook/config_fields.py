"""A config dataclass's fields as the doors show them: each field's default and help are written once, on
the dataclass (`field(default=..., metadata={"help": ...})`), and read from there by the command line
(`add_field_arguments`, `field_values`) and by the service's pydantic models
(`services/engine/config_models.py`), so that no door can give another default.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints


def config_field(config: Any, name: str) -> dataclasses.Field:
    """The dataclass field `name` of `config` (a config dataclass or an instance of one)."""
    for candidate in dataclasses.fields(config):
        if candidate.name == name:
            return candidate
    raise KeyError(f"no field {name!r} in {config}")


def help_of(config: object, name: str) -> str:
    """The field's help, as its metadata holds it."""
    return str(config_field(config, name).metadata["help"])


def default_of(config: object, name: str) -> Any:
    """The field's value in `config` when it is an instance; else its default, a factory's called now
    (a default that reads the environment, as the device's does, is read at each call)."""
    found = config_field(config, name)
    if not isinstance(config, type):
        return getattr(config, name)
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    if found.default is dataclasses.MISSING:
        raise ValueError(f"{config.__name__}.{name} has no default")
    return found.default


def type_of(config: object, name: str) -> Any:
    """The field's annotation, resolved (`int | None`, a Literal, ...)."""
    return get_type_hints(config if isinstance(config, type) else type(config))[name]


def _without_none(annotation: Any) -> Any:
    """`X | None` -> X; anything else as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [arg for arg in get_args(annotation) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def add_field_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    config: object,
    names: Sequence[str],
    *,
    flags: Mapping[str, str] | None = None,
) -> None:
    """One `--flag` per field of `config` in `names`: its type (a Literal's values as choices, a bool as
    `--x/--no-x`), its default and its help. The flag is the field's name with dashes, or `flags[name]`;
    `field_values` reads them back."""
    for name in names:
        flag = (flags or {}).get(name, name.replace("_", "-"))
        default = default_of(config, name)
        kind = _without_none(type_of(config, name))
        shown = "" if default is None else " (default: %(default)s)"
        options: dict[str, Any] = {"default": default, "help": help_of(config, name) + shown}
        if get_origin(kind) is Literal:
            options["choices"] = get_args(kind)
        elif kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
        parser.add_argument(f"--{flag}", **options)


def field_values(
    args: argparse.Namespace, names: Sequence[str], *, flags: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The fields `add_field_arguments` added, as the arguments give them: name -> value."""
    return {name: getattr(args, (flags or {}).get(name, name).replace("-", "_")) for name in names}
