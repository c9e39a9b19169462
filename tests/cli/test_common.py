"""What the subcommands share (`cli/common.py`): where --data points when it is not given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from openbook.cli import main
from openbook.cli.common import add_data_argument, data_dir


def parse(layout: str | None, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_data_argument(parser, layout, "data")
    parser.add_argument("--full", action="store_true")
    return parser.parse_args(list(argv))


def test_data_defaults_to_its_layout_below_openbook_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENBOOK_DATA", str(tmp_path))
    assert data_dir(parse("k-shot")) == str(tmp_path / "k-shot")
    assert data_dir(parse("k-shot", "--full")) == str(tmp_path / "full")  # eval --full reads full/
    assert data_dir(parse(None)) == str(tmp_path)
    assert data_dir(parse("k-shot", "--data", "elsewhere")) == "elsewhere"  # a given --data wins


def test_without_data_or_openbook_data_the_command_says_how_to_give_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.delenv("OPENBOOK_DATA", raising=False)
    args = ["train", "--task", "toy", "--method", "prompt-ft", "--seed", "1", "--out", str(tmp_path / "out")]
    assert main(args) == 2
    assert "openbook train: error: give --data, or set OPENBOOK_DATA" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
