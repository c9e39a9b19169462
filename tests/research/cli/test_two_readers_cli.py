"""`python -m research two-readers --read` on probe 3's and probe 4's records, and `--combine` on a grid's
kept distributions: the rules read from files, nothing run."""

import json

import numpy as np

from research.cli import main
from research.experiments.distributions import write_distributions
from research.experiments.evaluation import MethodResult


def _probe(variant: str, task: str, knn: float, tune_s: float) -> dict:
    return {"variant": variant, "task": task, "seed": 1, "shots": 16, "knn": knn, "tune_s": tune_s,
            "lm": 50.0, "frozen_knn": 40.0, "logreg": knn}  # fmt: skip


def test_read_prints_probe_3s_choice_and_probe_4_against_it(tmp_path, capsys):
    third, fourth = tmp_path / "p3", tmp_path / "p4"
    third.mkdir(), fourth.mkdir()
    rows = [_probe("t4", "a", 70, 100), _probe("t6", "a", 72, 150), _probe("t6s", "a", 73, 400)]
    (third / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (fourth / "runs.jsonl").write_text(json.dumps(_probe("t12", "a", 73.6, 900)) + "\n")
    assert main(["two-readers", "--data", str(tmp_path), "--out", str(third), "--read"]) == 0
    assert '"chosen": "t6"' in capsys.readouterr().out  # t6s is 4x t4's time
    assert (
        main(["two-readers", "--data", str(tmp_path), "--out", str(fourth), "--read", "--kept", str(third)])
        == 0
    )
    out = capsys.readouterr().out
    assert "probe 4 (against probe 3's t6)" in out and '"build": true' in out  # 73.6 against 72: +1.6


def test_combine_reads_the_rule_on_kept_distributions(tmp_path, capsys):
    gold = np.array([0, 1])
    # the book sure and right where the prompt is sure and wrong: only the product of experts gets both
    p_lm, p_knn = np.array([[0.1, 0.9], [0.4, 0.6]]), np.array([[1.0, 0.0], [0.6, 0.4]])
    for task in ("a", "b"):
        write_distributions(
            tmp_path, task, 1, ["0", "1"],
            {"zero-shot": MethodResult(p_lm, {}, p_lm), "book": MethodResult(p_knn, {"k": 16}, p_knn)},
            {"dev": gold, "test": gold},
        )  # fmt: skip
    assert main(["two-readers", "--data", str(tmp_path), "--combine", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| geometric | 100.0 | 100.0 | 100.0 |" in out and "| linear | 50.0 | 50.0 | 50.0 |" in out
    assert "chosen: geometric" in out


def test_refusal_reads_the_rule_on_a_judge_grids_records(tmp_path, capsys):
    def record(confidence: float, nearest: float) -> dict:
        read = {"in_scope_accuracy_answering_all": 0.9, "in_scope_accuracy": 0.87}
        return {
            "params": {
                "refusals": {
                    "confidence": {**read, "recall": confidence},
                    "nearest": {**read, "recall": nearest},
                }
            }
        }

    (tmp_path / "results.json").write_text(json.dumps([record(0.6, 0.7), record(0.5, 0.56)]))
    assert main(["two-readers", "--data", str(tmp_path), "--refusal", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| nearest | 63.0 | 70.0, 56.0 | 3.0 |" in out and "chosen: nearest" in out  # +8.0
