"""What the subcommands share (`cli/common.py`): where --data points when it is not given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from openbook.cli.common import (
    add_data_argument,
    add_training_arguments,
    data_dir,
    train_config,
)

from services.cli import main


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
    assert data_dir(parse("k-shot", "--full")) == str(tmp_path / "full")  # the lab's eval --full reads full/
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


def parse_training(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_budget_flags_reach_train_config(capsys) -> None:
    from openbook.train_config import TrainConfig

    by_epochs = train_config(parse_training("--epochs", "2.5", "--train-batch-size", "4"), seed=7)
    assert by_epochs == TrainConfig(epochs=2.5, batch_size=4, seed=7)
    assert by_epochs.total_steps(96) == 60
    assert train_config(parse_training("--steps", "5"), seed=7).total_steps(96) == 5
    assert train_config(parse_training(), seed=7) == TrainConfig(seed=7)  # neither: the default budget
    with pytest.raises(SystemExit) as exited:
        parse_training("--steps", "5", "--epochs", "2")
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(ValueError, match="epochs must be a positive number"):
        train_config(parse_training("--epochs", "0"), seed=7)


def test_an_epoch_budget_from_the_flags_checks_dev_each_epoch_under_its_cap() -> None:
    args = parse_training("--epochs", "20", "--patience", "4", "--max-steps", "200")
    config = train_config(args, seed=7)
    assert (config.max_steps, config.eval_every, config.patience) == (200, None, 4)
    assert (config.total_steps(96), config.check_every(96)) == (200, 12)  # 240 planned; an epoch: 12 steps
    assert train_config(parse_training("--epochs", "2", "--eval-every", "5"), seed=7).check_every(96) == 5
    assert train_config(parse_training("--steps", "32"), seed=7).check_every(96) == 8  # a step budget
    assert train_config(parse_training(), seed=7).check_every(96) == 8  # the default budget too
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        train_config(parse_training("--epochs", "2", "--max-steps", "0"), seed=7)


def test_an_interrupted_command_exits_130_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from openbook.cli import COMMANDS

    def interrupted(args: argparse.Namespace, argv: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(COMMANDS["prepare"], "run", interrupted)
    assert main(["prepare"]) == 130
    assert capsys.readouterr().err == "\nopenbook prepare: interrupted\n"
