"""`dev_split`: dev held out by a hash of each id, as the service's trainer and `Estimator.fit` do."""

from __future__ import annotations

import hashlib

import pytest
from openbook.dev_split import checked_on, in_dev, split_dev


def test_the_dev_split_never_reshuffles_as_examples_arrive() -> None:
    few = {i: (f"text {i}", "1" if i % 2 else "0") for i in range(1, 41)}
    many = {**few, **{i: (f"text {i}", "1" if i % 2 else "0") for i in range(41, 401)}}
    train_few, dev_few = split_dev(few)
    train_many, dev_many = split_dev(many)
    assert dev_few == [i for i in dev_many if i <= 40] and train_few == [i for i in train_many if i <= 40]
    assert set(dev_many).isdisjoint(train_many) and len(dev_many) + len(train_many) == 400
    assert 0.18 < len(dev_many) / 400 < 0.32  # one in four, by a hash
    assert dev_few[:5] == [9, 10, 12, 21, 24] and all(in_dev(i) for i in dev_many)


def test_a_label_all_in_dev_trains_on_its_examples_and_an_empty_dev_is_allowed() -> None:
    # ids 9 and 10 fall in dev by their hash: label 0 would have nothing to train on, so they train
    assert split_dev({1: ("good", "1"), 9: ("bad", "0"), 10: ("awful", "0")}) == ([1, 9, 10], [])
    # once label 0 has an example outside dev, its dev examples are held out again
    assert split_dev({1: ("good", "1"), 9: ("bad", "0"), 10: ("awful", "0"), 2: ("poor", "0")}) == (
        [1, 2],
        [9, 10],
    )
    assert split_dev({1: ("good", "1"), 2: ("bad", "0")}) == ([1, 2], [])


def test_a_quarter_is_the_service_split_of_always_and_a_smaller_share_holds_out_a_subset() -> None:
    # the split the service made before the share could be chosen: the hash's two lowest bits are 0
    def one_in_four(i: int) -> bool:
        return int.from_bytes(hashlib.sha256(str(i).encode()).digest()[:8], "big") % 4 == 0

    assert [i for i in range(2000) if in_dev(i)] == [i for i in range(2000) if one_in_four(i)]
    tenth = [i for i in range(2000) if in_dev(i, 0.1)]
    assert set(tenth) < {i for i in range(2000) if in_dev(i)} and 0.07 < len(tenth) / 2000 < 0.13
    assert not any(in_dev(i, 0.0) for i in range(2000))


def test_no_dev_share_trains_on_everything_and_checks_on_train() -> None:
    examples = {i: (f"text {i}", str(i % 2)) for i in range(20)}
    train_ids, dev_ids = split_dev(examples, 0.0)
    assert (train_ids, dev_ids) == (list(range(20)), [])
    assert checked_on(train_ids, dev_ids) == train_ids
    with pytest.raises(ValueError, match="dev fraction"):
        split_dev(examples, 1.0)
