"""The continual protocol: metrics on hand-made numbers, a 2-stage run on tiny backbones, its records.

`python -m research continual` itself is tests/research/cli/test_continual.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.backbone import Backbone
from openbook.prompting import PromptError, Template
from openbook.train_config import TrainConfig

from research.experiments.continual import (
    average_accuracy,
    build_stages,
    forgetting,
    load_stage_data,
    parse_stage_words,
    run_continual,
    union_verbalizer,
)

WORDS = {"toy": "0=bad,1=good", "qs": "0=what,1=who,2=where"}
CONFIG = TrainConfig(steps=4, batch_size=4, lr=1e-3, eval_every=2, patience=5, calibration="none")


def test_average_accuracy_and_forgetting_on_hand_made_numbers() -> None:
    matrix = [
        [0.90],
        [0.70, 0.80],
        [0.60, 0.85, 0.50],
    ]
    assert average_accuracy(matrix) == pytest.approx((0.60 + 0.85 + 0.50) / 3)
    # Stage 0: best before the last stage 0.90, final 0.60 -> 0.30. Stage 1: best 0.80, final 0.85 -> -0.05
    # (it improved: backward transfer counts negative). The last stage has nothing to forget yet.
    assert forgetting(matrix) == pytest.approx((0.30 - 0.05) / 2)
    # The best can come after the stage itself: stage 0 peaks after stage 1 here.
    assert forgetting([[0.5], [0.7, 0.9], [0.4, 0.9, 0.8]]) == pytest.approx((0.3 + 0.0) / 2)
    assert forgetting([[0.8]]) is None and average_accuracy([[0.8]]) == 0.8


def test_stages_namespace_labels_and_grow_the_verbalizer(tmp_path: Path, toy_dataset) -> None:
    stages = build_stages(["toy", "qs"], WORDS)
    assert [s.prefix for s in stages] == ["toy", "qs"]
    assert build_stages(["SST-2", "mpqa"])[0].prefix == "sst2"
    assert union_verbalizer(stages[:1]).labels == ("toy:0", "toy:1")
    grown = union_verbalizer(stages)
    assert grown.labels == ("toy:0", "toy:1", "qs:0", "qs:1", "qs:2")
    assert grown.words == ("bad", "good", "what", "who", "where")
    assert parse_stage_words(toy_dataset.stage_labels) == WORDS
    data = load_stage_data(toy_dataset.two_stages(tmp_path), stages, seed=1, test_size=5)
    assert [len(d.test) for d in data] == [5, 5]
    assert {e.label for e in data[1].train} == {"qs:0", "qs:1", "qs:2"}
    again = load_stage_data(tmp_path, stages, seed=1, test_size=5)
    assert [e.text for e in again[0].test] == [e.text for e in data[0].test]  # a fixed sample


def test_bad_stage_words_are_clear_errors() -> None:
    with pytest.raises(PromptError, match="same word"):
        build_stages(["toy", "qs"], {"toy": "0=bad,1=good", "qs": "0=good,1=who"})
    with pytest.raises(PromptError, match="no label words for continual stage 'nope'"):
        build_stages(["nope"])
    with pytest.raises(ValueError, match="distinct tasks"):
        build_stages(["toy", "toy"], WORDS)
    with pytest.raises(PromptError, match="task:label=word"):
        parse_stage_words("toy=bad")


def test_two_stages_give_a_triangle_of_accuracies(
    tmp_path: Path, causal_backbone: Backbone, toy_dataset
) -> None:
    data = toy_dataset.two_stages(tmp_path)
    stages = build_stages(["toy", "qs"], WORDS)
    initial = {k: v.clone() for k, v in causal_backbone.model.state_dict().items()}
    records = run_continual(
        causal_backbone,
        data,
        stages,
        ["l2p", "prompt-ft", "retroprompt"],
        [1],
        CONFIG,
        template=Template("{text} It was {mask}"),
        test_size=6,
        progress=False,
    )
    assert [r.method for r in records] == ["l2p", "prompt-ft", "retroprompt"]
    for record in records:
        assert record.stages == ["toy", "qs"] and record.seed == 1 and record.test_size == 6
        assert [len(row) for row in record.accuracy] == [1, 2]
        assert record.average_accuracy == pytest.approx(np.mean(record.accuracy[1]))
        assert record.forgetting == pytest.approx(record.accuracy[0][0] - record.accuracy[1][0])
        assert [p["stage"] for p in record.params] == ["toy", "qs"]
        assert all(0.0 <= a <= 1.0 for row in record.accuracy for a in row)
    by_method = {r.method: r for r in records}
    # The open book keeps the first stage's 8 examples beside the second stage's 9; the others do not.
    assert [p["store_size"] for p in by_method["retroprompt"].params] == [8, 17]
    assert "lam" in by_method["retroprompt"].params[1]  # kNN interpolation chosen on the stage's dev
    assert [p["store_size"] for p in by_method["l2p"].params] == [8, 9]
    for name, tensor in causal_backbone.model.state_dict().items():  # every run starts from, and restores,
        assert torch.equal(tensor, initial[name]), name  # the initial weights


def test_processes_sharing_an_out_directory_keep_every_record(tmp_path: Path) -> None:
    """Each process starts from what was on disk when it began; a record written since is kept."""
    from research.experiments.continual import ContinualRecord, add_continual_record, read_continual_results

    def record(method: str, seed: int) -> ContinualRecord:
        return ContinualRecord(
            method=method, seed=seed, stages=["a", "b"], test_size=4, accuracy=[[1.0], [0.5, 1.0]],
            average_accuracy=0.75, forgetting=0.5, params=[], seconds=1.0,
        )  # fmt: skip

    for method in ("l2p", "prompt-ft", "retroprompt"):  # three processes, one method each
        add_continual_record(record(method, 13), tmp_path, "# header\n")
    add_continual_record(record("l2p", 13), tmp_path)  # a cell already there is not written twice
    assert [(r.method, r.seed) for r in read_continual_results(tmp_path)] == [
        ("l2p", 13), ("prompt-ft", 13), ("retroprompt", 13)
    ]  # fmt: skip
    assert "| retroprompt |" in (tmp_path / "continual.md").read_text()
