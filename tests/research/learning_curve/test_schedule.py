"""The labeller's schedule: seed-fixed, cumulative per class, and the same data whatever else runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from openbook.data import DataError, load_full_train_test

from research.learning_curve.schedule import (
    check_rounds,
    class_order,
    fixed_rounds,
    load_curve_data,
    per_class,
    pool_ids,
    round_sizes,
)


def _full(root: Path) -> Path:
    """SST-2 and TREC in the full/ layout: label<space>text, one a line."""
    root.mkdir()
    train = [f"{i % 2} review number {i}" for i in range(80)]
    (root / "stsa.binary.train").write_text("\n".join(train) + "\n")
    (root / "stsa.binary.dev").write_text("\n".join(f"{i % 2} test review {i}" for i in range(30)) + "\n")
    (root / "TREC.train.all").write_text("\n".join(f"{i % 6} question {i} ?" for i in range(120)) + "\n")
    (root / "TREC.test.all").write_text("\n".join(f"{i % 6} test question {i} ?" for i in range(12)) + "\n")
    return root


def test_rounds_are_cumulative_per_class_and_fixed_by_the_seed(tmp_path: Path) -> None:
    data = load_curve_data(_full(tmp_path / "full"), "trec", test_size=None)
    rounds = [2, 4, 8]
    added = fixed_rounds(data.train, 13, rounds)
    assert added == fixed_rounds(data.train, 13, rounds)  # deterministic
    assert added != fixed_rounds(data.train, 21, rounds)  # and the seed matters
    order = class_order(data.train, 13)
    labelled: list[int] = []
    for shots, new in zip(rounds, added, strict=True):
        assert not set(new) & set(labelled)  # a round adds only examples not labelled yet
        labelled += new
        assert per_class(data.train, labelled) == dict.fromkeys(data.labels, shots)
        # after round r: exactly the first `shots` of each class's shuffle
        assert sorted(labelled) == sorted(i for ids in order.values() for i in ids[:shots])
    # the first rounds do not depend on later ones (a longer schedule starts the same way)
    assert fixed_rounds(data.train, 13, [2, 4, 8, 16])[:3] == added
    assert round_sizes(rounds, len(data.labels)) == [12, 12, 24]


def test_a_class_with_too_few_examples_gives_what_it_has(tmp_path: Path) -> None:
    data = load_curve_data(_full(tmp_path / "full"), "SST-2", test_size=None)
    added = fixed_rounds(data.train, 13, [16, 64])
    assert per_class(data.train, added[0] + added[1]) == {"0": 40, "1": 40}


def test_the_pool_is_the_rest_or_a_seed_fixed_sample_of_it(tmp_path: Path) -> None:
    data = load_curve_data(_full(tmp_path / "full"), "SST-2", test_size=None)
    first = fixed_rounds(data.train, 13, [2])[0]
    everything = pool_ids(data.train, 13, first, None)
    assert sorted(everything + first) == list(range(len(data.train)))
    sample = pool_ids(data.train, 13, first, 10)
    assert len(sample) == 10 and sample == sorted(sample) and set(sample) <= set(everything)
    assert sample == pool_ids(data.train, 13, first, 10) != pool_ids(data.train, 21, first, 10)


def test_the_test_sample_is_the_same_for_every_seed_and_size_bounded(tmp_path: Path) -> None:
    full = _full(tmp_path / "full")
    sample = load_curve_data(full, "SST-2", test_size=8).test
    assert len(sample) == 8 and sample == load_curve_data(full, "SST-2", test_size=8).test
    assert all(e.text.startswith("test review") for e in sample)  # SST-2 tests on stsa.binary.dev
    assert len(load_curve_data(full, "sst-2", test_size=None).test) == 30  # the name's case does not matter


def test_a_judged_curve_scores_held_out_training_examples_and_never_labels_them(tmp_path: Path) -> None:
    full = _full(tmp_path / "full")
    whole = load_curve_data(full, "SST-2", test_size=None)
    judged = load_curve_data(full, "SST-2", test_size=None, judge=6)
    assert len(judged.test) == 6 and judged.test == load_curve_data(full, "SST-2", None, judge=6).test
    assert not any(e.text.startswith("test review") for e in judged.test)  # no test example is used
    assert len(judged.train) == len(whole.train) - 6
    assert not {e.text for e in judged.test} & {e.text for e in judged.train}  # never labelled
    for bad in (0, len(whole.train)):
        with pytest.raises(ValueError, match="--judge needs between 1 and"):
            load_curve_data(full, "SST-2", test_size=None, judge=bad)


def test_bad_rounds_and_unknown_tasks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="increasing"):
        check_rounds([2, 2, 4])
    with pytest.raises(ValueError, match="at least 1"):
        check_rounds([0, 4])
    full = _full(tmp_path / "full")
    with pytest.raises(DataError, match="no full training set for task 'mpqa'"):
        load_full_train_test(full, "mpqa")
    with pytest.raises(FileNotFoundError, match=r"stsa\.fine\.train"):
        load_full_train_test(full, "sst-5")
