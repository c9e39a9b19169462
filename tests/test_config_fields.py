"""`config_fields.py`: a config dataclass's fields, their defaults and help, as command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest
from openbook.config_fields import add_field_arguments, default_of, field_values, help_of

calls: list[int] = []


def _counted() -> int:
    calls.append(1)
    return len(calls)


@dataclass(frozen=True)
class Knobs:
    steps: int | None = field(default=None, metadata={"help": "how many"})
    rate: float = field(default=0.5, metadata={"help": "how fast"})
    mode: Literal["a", "b"] = field(default="b", metadata={"help": "which"})
    loud: bool = field(default=False, metadata={"help": "say so"})
    drawn: int = field(default_factory=_counted, metadata={"help": "read when asked"})


def test_each_field_becomes_a_flag_of_its_type_default_and_help(capsys) -> None:
    parser = argparse.ArgumentParser()
    add_field_arguments(parser, Knobs, ("steps", "rate", "mode", "loud"), flags={"rate": "learning-rate"})
    names = ("steps", "rate", "mode", "loud")
    given = parser.parse_args(["--steps", "3", "--learning-rate", "0.25", "--mode", "a", "--loud"])
    assert field_values(given, names, flags={"rate": "learning-rate"}) == {
        "steps": 3,
        "rate": 0.25,
        "mode": "a",
        "loud": True,
    }
    defaults = field_values(parser.parse_args([]), names, flags={"rate": "learning-rate"})
    assert defaults == {"steps": None, "rate": 0.5, "mode": "b", "loud": False}
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])  # a Literal's values are the choices
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "how fast (default: 0.5)" in shown and "--no-loud" in shown and "how many" in shown


def test_a_default_is_the_instances_value_or_the_fields_and_a_factory_runs_at_each_call() -> None:
    assert default_of(Knobs, "rate") == 0.5 and default_of(Knobs(rate=2.0), "rate") == 2.0
    assert default_of(Knobs, "drawn") != default_of(Knobs, "drawn")  # read anew, as the device's env is
    assert help_of(Knobs, "mode") == "which"
    with pytest.raises(KeyError, match="no field 'speed'"):
        default_of(Knobs, "speed")
