"""What a results directory records (`research/cli/settings.py`): every setting it was made with, the
budget spelled out, compared both ways when a grid resumes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from openbook.cli.common import (
    add_label_scoring_argument,
    add_prompt_arguments,
    add_training_arguments,
    classifier_from_args,
    train_config,
)

from research.cli.settings import checked_settings


def _settings_parser(out: Path) -> argparse.ArgumentParser:
    """The arguments `checked_settings` reads, writing into `out`."""
    parser = argparse.ArgumentParser()
    add_prompt_arguments(parser)
    add_training_arguments(parser)
    parser.add_argument("--out", default=str(out))
    for name in ("data", "shots", "calibration"):
        parser.add_argument(f"--{name}")
    return parser


def test_the_settings_record_the_budget_as_it_was_given(tmp_path: Path) -> None:
    from openbook.train_config import DEFAULT_MAX_STEPS

    parser = _settings_parser(tmp_path)
    by_steps = checked_settings(parser.parse_args(["--steps", "32"]))
    assert (by_steps["steps"], by_steps["eval_every"], "max_steps" in by_steps) == (
        32,
        8,
        False,
    )  # as results made before --epochs
    # the default budget, spelled out: results made under 32 steps by default do not resume under it
    by_default = checked_settings(parser.parse_args([]))
    assert (by_default["steps"], by_default["epochs"], by_default["min_steps"], by_default["eval_every"]) == (
        None,
        8.0,
        32,
        8,
    )
    by_epochs = checked_settings(parser.parse_args(["--epochs", "8"]))
    assert (by_epochs["steps"], by_epochs["epochs"]) == (None, 8.0)
    # the cap spelled out; no eval_every: a check every epoch (so results checked every 8 steps do not resume)
    assert (by_epochs["max_steps"], by_epochs["eval_every"]) == (DEFAULT_MAX_STEPS, None)
    assert "epochs" not in checked_settings(parser.parse_args(["--steps", "64"]))


def test_bfloat16_precision_reaches_the_config_and_is_recorded(tmp_path: Path) -> None:
    import json

    parser = _settings_parser(tmp_path)
    plain, mixed = parser.parse_args([]), parser.parse_args(["--train-precision", "bfloat16"])
    assert (train_config(plain, 7).precision, train_config(mixed, 7).precision) == ("float32", "bfloat16")
    assert checked_settings(plain)["train_precision"] == "float32"
    (tmp_path / "settings.json").write_text(json.dumps(checked_settings(plain)))
    with pytest.raises(ValueError, match="train_precision: 'float32' -> 'bfloat16'"):
        checked_settings(mixed)


def test_keep_reaches_the_config_and_is_recorded(tmp_path: Path) -> None:
    parser = _settings_parser(tmp_path)
    plain, best = parser.parse_args([]), parser.parse_args(["--keep", "best"])
    assert (train_config(plain, 7).keep, train_config(best, 7).keep) == ("last", "best")
    assert (checked_settings(plain)["keep"], checked_settings(best)["keep"]) == ("last", "best")


@pytest.mark.parametrize("setting", ["keep", "train_precision", "full", "full_dev_size"])
def test_a_directory_that_does_not_record_a_setting_does_not_resume(tmp_path: Path, setting: str) -> None:
    """Every setting is recorded: one a directory lacks is not taken for any value."""
    import json

    parser = _settings_parser(tmp_path)
    recorded = checked_settings(parser.parse_args([]))
    del recorded[setting]
    (tmp_path / "settings.json").write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match=f"other settings \\({setting}: not recorded -> "):
        checked_settings(parser.parse_args([]))


@pytest.mark.parametrize(
    ("made_with", "resumed_with", "said"),
    [
        (["--keep", "best"], [], "keep: 'best' -> 'last'"),  # as every directory made before "last"
        (["--train-precision", "bfloat16"], [], "train_precision: 'bfloat16' -> 'float32'"),
        ([], ["--keep", "best"], "keep: 'last' -> 'best'"),
    ],
)
def test_a_setting_is_compared_both_ways(
    tmp_path: Path, made_with: list[str], resumed_with: list[str], said: str
) -> None:
    import json

    parser = _settings_parser(tmp_path)
    (tmp_path / "settings.json").write_text(json.dumps(checked_settings(parser.parse_args(made_with))))
    assert checked_settings(parser.parse_args(made_with))  # resumed as made
    with pytest.raises(ValueError, match=f"other settings \\({said}\\)"):
        checked_settings(parser.parse_args(resumed_with))


def test_label_scoring_reaches_the_classifier_and_the_settings(causal_dir: Path, tmp_path: Path) -> None:
    import json

    parser = argparse.ArgumentParser()
    add_prompt_arguments(parser)
    add_label_scoring_argument(parser)
    add_training_arguments(parser)
    parser.add_argument("--out", default=str(tmp_path))
    for name in ("data", "shots", "calibration"):
        parser.add_argument(f"--{name}")
    argv = ["--backbone", str(causal_dir), "--template", "{text} It was {mask}", "--labels", "0=bad,1=good"]
    plain = classifier_from_args(parser.parse_args(argv), None)
    assert plain.label_scoring == "exact"
    assert plain.label_bias is None  # each command measures its calibration modes' biases itself
    args = parser.parse_args([*argv, "--label-scoring", "vectors"])
    assert classifier_from_args(args, None).label_scoring == "vectors"
    assert checked_settings(args)["label_scoring"] == "vectors"
    (tmp_path / "settings.json").write_text(json.dumps(checked_settings(parser.parse_args(argv))))
    assert checked_settings(parser.parse_args(argv))["label_scoring"] == "exact"  # resumes as recorded
    with pytest.raises(ValueError, match="label_scoring: 'exact' -> 'vectors'"):
        checked_settings(args)
    # the default, auto, is recorded as what it resolves to: above 16 labels, label vectors
    many = ",".join(f"{n}=word{n}" for n in range(17))
    wide = parser.parse_args([*argv[:-1], many, "--out", str(tmp_path / "wide")])
    assert wide.label_scoring == "auto" and classifier_from_args(wide, None).label_scoring == "vectors"
    assert checked_settings(wide)["label_scoring"] == "vectors"


def test_every_committed_results_directory_records_every_setting(tmp_path: Path) -> None:
    """No command reads an older settings.json shape: the committed ones say what ran, every setting
    `checked_settings` records among them."""
    import json

    parser = _settings_parser(tmp_path)
    parser.add_argument("--label-scoring", default="exact")
    recorded = set(checked_settings(parser.parse_args([]))) | {"knn"}
    recorded -= {"epochs", "max_steps", "min_steps", "first_pass"}  # a step budget records none of them
    docs = Path(__file__).resolve().parents[3] / "docs"
    paths = sorted(docs.rglob("settings.json"))
    assert paths
    for path in paths:
        assert recorded <= set(json.loads(path.read_text())), (
            path,
            recorded - set(json.loads(path.read_text())),
        )
