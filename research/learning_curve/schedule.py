"""What the simulated labeller labels, and in which order: everything fixed by the seed.

An example's id is its line's index in the task's full training set, both as the service's example id
and as a pool id, so a record can always be traced back to the data.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from openbook.data import Example, fixed_sample, label_set, load_full_train_test

ROUNDS = (2, 4, 8, 16, 32)  # cumulative labelled examples per class
ORDERS = ("fixed", "uncertainty")


@dataclass(frozen=True)
class CurveData:
    task: str  # as the data names it, e.g. "SST-2"
    train: list[Example]  # the full training set; an example's id is its index here
    test: list[Example]  # the test sample every round and method is scored on

    @property
    def labels(self) -> list[str]:
        return label_set(self.train)


def load_curve_data(
    full_dir: str | Path, task: str, test_size: int | None, judge: int | None = None
) -> CurveData:
    """The task's full training set and a fixed sample of `test_size` of its test set (`data.fixed_sample`:
    the same sample whatever the seed, round or method).

    With `judge`, a curve to choose on: `judge` training examples, a sample fixed as `fixed_sample` fixes
    one, are held out of the labelling and scored in the test set's place; no test example is used.
    """
    train, test = load_full_train_test(full_dir, task)
    if judge is None:
        return CurveData(task, train, fixed_sample(test, test_size))
    if not 0 < judge < len(train):
        raise ValueError(f"--judge needs between 1 and {len(train) - 1} of {task}'s training examples")
    judged = fixed_sample(train, judge)
    held = {id(example) for example in judged}
    return CurveData(task, [e for e in train if id(e) not in held], judged)


def check_rounds(rounds: Sequence[int]) -> list[int]:
    rounds = list(rounds)
    if not rounds or rounds[0] < 1 or any(b <= a for a, b in itertools.pairwise(rounds)):
        raise ValueError(f"rounds must be increasing counts of examples per class, at least 1; got {rounds}")
    return rounds


def class_order(train: Sequence[Example], seed: int) -> dict[str, list[int]]:
    """Per label (in `label_set` order), its training-set ids in a shuffle fixed by `seed`."""
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[int]] = {label: [] for label in label_set(train)}
    for i, example in enumerate(train):
        by_label[example.label].append(i)
    return {label: [ids[j] for j in rng.permutation(len(ids))] for label, ids in by_label.items()}


def fixed_rounds(train: Sequence[Example], seed: int, rounds: Sequence[int]) -> list[list[int]]:
    """Per round, the ids it adds: the next `rounds[r] - rounds[r-1]` of each class's shuffle, so after
    round r the labelled set is the first `rounds[r]` of each class (all of a class that has fewer)."""
    order = class_order(train, seed)
    added, previous = [], 0
    for shots in check_rounds(rounds):
        added.append([i for ids in order.values() for i in ids[previous:shots]])
        previous = shots
    return added


def round_sizes(rounds: Sequence[int], classes: int) -> list[int]:
    """How many examples each round adds when every class has enough: the uncertainty order asks the
    service for this many suggestions."""
    rounds = check_rounds(rounds)
    return [(shots - previous) * classes for previous, shots in zip([0, *rounds], rounds, strict=False)]


def pool_ids(train: Sequence[Example], seed: int, first_round: Sequence[int], size: int | None) -> list[int]:
    """The uncertainty order's pool: the training ids not labelled in the first round, or a sample of
    `size` of them fixed by `seed`; sorted, since the service scores the first pool texts by id."""
    labelled = set(first_round)
    rest = np.array([i for i in range(len(train)) if i not in labelled], dtype=np.int64)
    if size is not None and size < len(rest):
        rest = np.sort(np.random.default_rng([seed, 1]).choice(rest, size, replace=False))
    return rest.tolist()


def per_class(train: Sequence[Example], ids: Sequence[int]) -> dict[str, int]:
    """How many of `ids` each label has (every label of the task named, 0 included)."""
    counts = dict.fromkeys(label_set(train), 0)
    for i in ids:
        counts[train[i].label] += 1
    return counts
