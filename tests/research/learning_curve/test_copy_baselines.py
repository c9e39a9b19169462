"""`learning-curve --baselines-from`: a curve whose service reads with a sentence reader takes prompt-ft and
SetFit from a curve of the same grid that ran them, and refuses what depends on what differs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from openbook.methods import method_config

from research.experiments.setfit_peer import SetFitConfig
from research.learning_curve.report import CurveRecord, read_results, write_results
from research.learning_curve.setup import copy_baselines

TRAINING = {"batch_size": 8, "lr": 1e-5, "epochs": 8.0}


def _run(command: str, baselines: list[str], **changes: object) -> dict:
    return {
        "command": command,
        "settings": {
            "backbone": "gemma3-270m",
            "method": "retroprompt",
            "method_config": method_config("retroprompt"),
            "test_size": 500,
            "pool_size": 500,
            "training": dict(TRAINING),
            "max_length": 128,
            "baselines": baselines,
            "peer_configs": {"setfit": asdict(SetFitConfig())} if "setfit" in baselines else {},
            **changes,
        },
    }


def _records(
    methods: list[str], rounds: tuple[int, ...] = (2, 4), accuracy: float = 0.5
) -> list[CurveRecord]:
    return [
        CurveRecord("trec", 13, "fixed", method, shots, 6 * shots, accuracy + shots / 100, 1.0)
        for method in methods
        for shots in rounds
    ]


def _curves(tmp_path: Path, **source_changes: object) -> tuple[Path, Path]:
    """The reader's curve (service and its untrained task) and a curve of the same grid without a reader,
    its prompt-ft beside its service and its SetFit added by a run of baselines alone."""
    readers, plain = tmp_path / "readers", tmp_path / "plain"
    write_results(
        readers, [_run("readers", ["knn-interp"], reader="mpnet")], _records(["service", "knn-interp"])
    )
    runs = [
        _run("plain", ["knn-interp", "prompt-ft"], **source_changes),
        _run("setfit alone", ["setfit"], baselines_only=True),
    ]
    records = _records(["service", "knn-interp", "prompt-ft"], (2, 4, 8), 0.4) + _records(
        ["setfit"], (2, 4, 8), 0.3
    )
    write_results(plain, runs, records)
    return readers, plain


def test_prompt_ft_and_setfit_join_the_readers_curve_from_the_same_grid(tmp_path: Path) -> None:
    readers, plain = _curves(tmp_path)
    copied = copy_baselines(readers, plain, ["prompt-ft", "setfit"])
    assert sorted((r.method, r.shots) for r in copied) == [
        (method, shots)
        for method in ("prompt-ft", "setfit")
        for shots in (2, 4)  # the readers' rounds alone
    ]
    runs, records = read_results(readers)
    assert [r["command"].split("; made by: ")[-1] for r in runs] == ["readers", "plain", "setfit alone"]
    assert all(r["settings"]["baselines_only"] for r in runs[1:])
    assert {r.method for r in records} == {"service", "knn-interp", "prompt-ft", "setfit"}
    assert next(r for r in records if (r.method, r.shots) == ("prompt-ft", 2)).accuracy == pytest.approx(0.42)
    assert copy_baselines(readers, plain, ["prompt-ft"]) == [] and read_results(readers) == (runs, records)
    runs, records = read_results(plain)  # the source's prompt-ft changed since: refused, nothing written
    write_results(
        plain,
        runs,
        [r if r.method != "prompt-ft" else CurveRecord(**{**asdict(r), "accuracy": 0.9}) for r in records],
    )
    with pytest.raises(ValueError, match="has these records already"):
        copy_baselines(readers, plain, ["prompt-ft"])


@pytest.mark.parametrize(
    ("names", "changes", "message"),
    [
        (["knn-interp"], {}, "other settings than .*: reader"),  # the untrained task reads the reader's book
        (["prompt-ft"], {"training": {**TRAINING, "lr": 3e-5}}, "other settings than .*: training"),
        (["setfit/encoder=minilm"], {}, "recorded no setfit/encoder=minilm baseline"),
    ],
)
def test_a_baseline_that_depends_on_what_differs_is_refused_and_nothing_written(
    tmp_path: Path, names: list[str], changes: dict, message: str
) -> None:
    readers, plain = _curves(tmp_path, **changes)
    before = (readers / "results.json").read_text()
    with pytest.raises(ValueError, match=message):
        copy_baselines(readers, plain, names)
    assert (readers / "results.json").read_text() == before


def test_a_source_without_every_round_is_refused(tmp_path: Path) -> None:
    readers, plain = _curves(tmp_path)
    runs, records = read_results(plain)
    write_results(plain, runs, [r for r in records if (r.method, r.shots) != ("prompt-ft", 4)])
    with pytest.raises(ValueError, match=r"lacks prompt-ft rounds .*\('trec', 13, 4\)"):
        copy_baselines(readers, plain, ["prompt-ft"])
