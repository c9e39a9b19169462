"""The library's config dataclasses as the service's pydantic fields: each field's type, default and help
(`openbook.config_fields`) read from the dataclass, the bounds the api puts on it given here, so that a
task's settings and the service's start from the library's defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from openbook.config_fields import config_field, default_of, help_of, type_of
from pydantic import BaseModel, Field, create_model


def mirrored(config: object, name: str, **bounds: Any) -> Any:
    """A pydantic `Field` with the default of `config`'s field `name` (a factory's called when the model
    is built, as the dataclass calls it) and its help as the description; `bounds` are pydantic's
    (`ge`, `le`, `strict`, ...)."""
    factory = config_field(config, name).default_factory
    described = {"description": help_of(config, name), **bounds}
    if isinstance(config, type) and factory is not dataclasses.MISSING:
        return Field(default_factory=factory, **described)
    return Field(default_of(config, name), **described)


def mirrored_fields(config: object, bounds: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`create_model`'s field definitions for the fields of `config` named in `bounds`, in that order:
    name -> (the dataclass field's type, `mirrored` under its bounds)."""
    return {
        name: (type_of(config, name), mirrored(config, name, **limits)) for name, limits in bounds.items()
    }


def model_of(name: str, fields: Mapping[str, Any], *, base: type[BaseModel] = BaseModel) -> Any:
    """A pydantic model of `fields` (`mirrored_fields`' definitions, and any others), typed Any: a type
    checker cannot know fields made at run time, so a model subclassing it reads them unchecked."""
    return create_model(name, __base__=base, **fields)
