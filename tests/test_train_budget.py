"""A training run's budget (`TrainConfig`): epochs into steps under the floor and the cap, the dev checks'
spacing, the default budget on the task sizes people bring, and budgets refused."""

from __future__ import annotations

from typing import Any

import pytest
from openbook.train_config import (
    DEFAULT_EPOCHS,
    DEFAULT_EVAL_EVERY,
    DEFAULT_MAX_STEPS,
    DEFAULT_MIN_STEPS,
    TrainConfig,
)


@pytest.mark.parametrize(
    ("num_train", "batch_size", "epochs", "expected"),
    [
        (32, 8, 8.0, 32),  # SST-2's 16 shots per class: 8 epochs are today's 32 steps
        (96, 8, 8.0, 96),  # trec's six classes: the same epochs are three times the steps
        (30, 8, 1.0, 4),  # a last, partial batch is a step
        (10, 4, 3.0, 9),  # ... of every epoch: 3 x ceil(10 / 4), not ceil(3 x 10 / 4) = 8
        (30, 1, 0.1, 3),  # 0.1 * 30 is 3.0000000000000004 in floats: still 3 steps
        (5, 8, 0.5, 1),  # never less than one step
        (96, 8, 20.0, DEFAULT_MAX_STEPS),  # 240 steps planned: the default cap binds
    ],
)
def test_an_epoch_budget_is_ceil_of_epochs_times_steps_per_epoch_under_the_cap(
    num_train: int, batch_size: int, epochs: float, expected: int
) -> None:
    assert TrainConfig(epochs=epochs, batch_size=batch_size).total_steps(num_train) == expected


def test_min_steps_is_a_floor_under_an_epoch_budget_and_below_the_cap() -> None:
    floor = TrainConfig(epochs=8, min_steps=32)
    assert [floor.total_steps(n) for n in (32, 24, 96, 80)] == [32, 32, 96, 80]  # 8 epochs, at least 32
    assert TrainConfig(epochs=8, min_steps=200).total_steps(24) == DEFAULT_MAX_STEPS  # the cap wins
    assert floor.budget() == {"epochs": 8, "max_steps": DEFAULT_MAX_STEPS, "min_steps": 32}
    assert "min_steps" not in TrainConfig(epochs=8).budget()  # settings recorded before it read the same
    for bad in ({"min_steps": 32}, {"epochs": 8, "min_steps": 0}):  # a floor of a step budget; not positive
        with pytest.raises(ValueError, match="min_steps"):
            TrainConfig(**bad)


def test_the_default_budget_is_8_epochs_of_at_least_32_steps_checked_every_8() -> None:
    default = TrainConfig()
    # SST-2 and trec at 16 per class (32 and 96 examples), 4 per class on SST-2, 64 per class on trec
    assert [default.total_steps(n) for n in (32, 96, 8, 384)] == [32, 96, 32, DEFAULT_MAX_STEPS]
    assert default.check_every(96) == default.check_every(8) == DEFAULT_EVAL_EVERY  # not every epoch
    assert default.budget() == {
        "epochs": DEFAULT_EPOCHS,
        "max_steps": DEFAULT_MAX_STEPS,
        "min_steps": DEFAULT_MIN_STEPS,
        "eval_every": DEFAULT_EVAL_EVERY,
        "first_pass": True,
    }
    # spelled out, it runs the same
    assert TrainConfig(**default.budget()).budget() == default.budget()
    assert TrainConfig(**default.budget()).total_steps(8) == default.total_steps(8)
    assert TrainConfig(max_steps=40).total_steps(96) == 40  # a cap given caps the default too
    assert TrainConfig(eval_every=3).budget()["eval_every"] == 3


# 16 shots per class of 2 to 6 classes (the benchmarks' k-shot tasks), and of 8
SIXTEEN_SHOT_SETS = [16 * classes for classes in (2, 3, 4, 5, 6, 8)]


def test_the_default_budget_of_a_16_shot_task_is_as_before_first_pass() -> None:
    """The whole-pass rule binds on no 16-shot task of up to 8 classes: their steps and dev checks are those
    of the budget without it (8 epochs, 32 to 120 steps, a check every 8 steps)."""
    default = TrainConfig()
    without = TrainConfig(epochs=DEFAULT_EPOCHS, min_steps=DEFAULT_MIN_STEPS, eval_every=DEFAULT_EVAL_EVERY)
    assert not without.makes_first_pass() and default.makes_first_pass()
    for num_train in SIXTEEN_SHOT_SETS:
        assert (
            default.total_steps(num_train) == without.total_steps(num_train) == min(120, max(32, num_train))
        )
        assert default.check_every(num_train) == without.check_every(num_train) == DEFAULT_EVAL_EVERY
    assert [default.total_steps(n) for n in (32, 96)] == [32, 96]  # SST-2 and trec, as documented


def test_the_default_budget_sees_1500_examples_once() -> None:
    default = TrainConfig()
    # 150 intents x 10 examples: an epoch is 188 steps, over the plain cap of 120
    assert default.total_steps(1500) == 188 > DEFAULT_MAX_STEPS
    assert default.check_every(1500) == 94  # two checks without gain span the epoch: no early stop inside it
    # the service holds one example in four out as dev: 1,125 to train on
    assert (default.total_steps(1125), default.check_every(1125)) == (141, 71)
    # spelled out as a job records it, it runs the same
    assert TrainConfig(**default.budget()).total_steps(1500) == 188
    assert TrainConfig(**default.budget()).check_every(1500) == 94
    # a budget given keeps its cap and checks unless it asks for the whole pass
    assert TrainConfig(epochs=8).total_steps(1500) == DEFAULT_MAX_STEPS
    assert TrainConfig(epochs=8, max_steps=50, first_pass=True).total_steps(1500) == 188
    assert TrainConfig(epochs=8, first_pass=True, patience=4).check_every(1500) == 188  # every epoch already
    assert TrainConfig(first_pass=False).total_steps(1500) == DEFAULT_MAX_STEPS
    assert "first_pass" not in TrainConfig(epochs=8).budget() | TrainConfig(first_pass=False).budget()
    with pytest.raises(ValueError, match="first_pass belongs to an epoch budget"):
        TrainConfig(steps=10, first_pass=True)


def test_a_step_budget_ignores_the_training_set_size() -> None:
    assert TrainConfig(steps=32).total_steps(96) == TrainConfig(steps=32).total_steps(8) == 32
    assert TrainConfig(steps=5).total_steps(96) == 5
    assert TrainConfig(steps=500).total_steps(96) == 500  # the default cap is an epoch budget's only
    assert TrainConfig(steps=500, max_steps=50).total_steps(96) == 50  # a cap given caps any budget
    assert TrainConfig(epochs=20, max_steps=400).total_steps(96) == 240


def test_dev_checks_default_to_every_epoch_under_epochs_and_to_8_steps_under_steps() -> None:
    assert TrainConfig(epochs=20).check_every(96) == 12  # ceil(96 / 8)
    assert TrainConfig(epochs=20, batch_size=4).check_every(10) == 3  # the short last batch is a step
    assert TrainConfig(epochs=20, eval_every=5).check_every(96) == 5  # given: steps, as ever
    assert TrainConfig(steps=32).check_every(96) == TrainConfig(steps=64).check_every(8) == DEFAULT_EVAL_EVERY


def test_the_budget_is_spelled_out_with_its_defaults() -> None:
    assert TrainConfig(steps=32).budget() == {"steps": 32, "eval_every": DEFAULT_EVAL_EVERY}
    assert TrainConfig(epochs=20).budget() == {"epochs": 20, "max_steps": DEFAULT_MAX_STEPS}  # checks: epochs
    assert TrainConfig(epochs=2.5, max_steps=9, eval_every=3).budget() == {
        "epochs": 2.5,
        "max_steps": 9,
        "eval_every": 3,
    }
    assert TrainConfig(steps=64, max_steps=50).budget() == {"steps": 64, "eval_every": 8, "max_steps": 50}


def test_a_config_saved_before_epoch_checks_loads_and_runs_as_it_did() -> None:
    # dataclasses.asdict of TrainConfig() when eval_every was 8 steps whatever the budget
    saved: dict[str, Any] = {
        "steps": 32, "epochs": None, "batch_size": 8, "lr": 1e-5, "weight_decay": 0.01, "warmup_ratio": 0.1,
        "max_grad_norm": 1.0, "eval_every": 8, "patience": 2, "reembed_every": None, "calibration": "domain",
        "seed": 13,
    }  # fmt: skip
    assert (TrainConfig(**saved).total_steps(96), TrainConfig(**saved).check_every(96)) == (32, 8)
    by_epochs = TrainConfig(**saved | {"steps": None, "epochs": 8.0})
    assert by_epochs.check_every(96) == 8  # its own eval_every, not an epoch's 12 steps


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 32, "epochs": 8.0}, "steps or as epochs, not both"),
        ({"epochs": 0.0}, "epochs must be a positive number"),
        ({"epochs": -1.0}, "epochs must be a positive number"),
        ({"epochs": float("nan")}, "epochs must be a positive number"),
        ({"epochs": float("inf")}, "epochs must be a positive number"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"eval_every": 0}, "eval_every and patience must be at least 1"),
        ({"epochs": 2.0, "eval_every": 0}, "eval_every and patience must be at least 1"),
        ({"epochs": 2.0, "patience": 0}, "eval_every and patience must be at least 1"),
        ({"epochs": 2.0, "max_steps": 0}, "max_steps must be at least 1"),
        ({"steps": 4, "max_steps": -1}, "max_steps must be at least 1"),
    ],
)
def test_a_contradictory_or_empty_budget_is_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)
