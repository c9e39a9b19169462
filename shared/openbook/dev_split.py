"""Holding out dev from labelled examples by a hash of each example's id: the service's split, and `fit`'s.

Each id is held out or not by sha256 of its decimal form alone, so the dev set grows with the examples but
never reshuffles: an example added later changes no other example's side. `split_dev` then gives back to
training any label whose every example fell in dev.

The hash's first 8 bytes are read with their bits reversed, lowest first, as a fraction u of 2^64, and an
id is in dev when u < the dev fraction: u < 1/4 exactly when the hash's two lowest bits are 0, the
service's "one id in four" of always, and a smaller fraction holds out a subset of a larger one's dev.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from openbook.prompting import TextInput

Examples = Mapping[int, tuple[TextInput, str]]  # id -> (text, label)

DEV_FRACTION = 0.25  # one example in four is held out as dev


def dev_position(example_id: int) -> int:
    """u * 2^64, from sha256 of the id's decimal form (the module's docstring says how); an int, so that
    comparing it with a fraction of 2^64 is exact."""
    digest = int.from_bytes(hashlib.sha256(str(example_id).encode()).digest()[:8], "big")
    return int(f"{digest:064b}"[::-1], 2)


def in_dev(example_id: int, fraction: float = DEV_FRACTION) -> bool:
    """Whether `example_id` is held out as dev: the same answer whatever else the examples hold."""
    return dev_position(example_id) < fraction * 2**64


def split_dev(examples: Examples, fraction: float = DEV_FRACTION) -> tuple[list[int], list[int]]:
    """(train ids, dev ids) by `in_dev`, each sorted.

    A label whose every example falls in dev (two examples do, one time in sixteen at a quarter) trains
    on them instead, and is left out of dev until it has an example to train on: a label the model never
    saw cannot be learnt, and a few-shot start is exactly when users label two of each. The dev set may
    be empty, or lack a label.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"the dev fraction must be in [0, 1), got {fraction}")
    held_out = {i for i in examples if in_dev(i, fraction)}
    trained = {examples[i][1] for i in examples if i not in held_out}
    dev_ids = [i for i in sorted(held_out) if examples[i][1] in trained]
    return sorted(set(examples) - set(dev_ids)), dev_ids


def checked_on(train_ids: list[int], dev_ids: list[int]) -> list[int]:
    """What training's dev checks and its choice of k, T and lambda score on: dev, or, with no dev
    example yet (a tiny set), the train examples, which then stand in for it."""
    return dev_ids or train_ids
