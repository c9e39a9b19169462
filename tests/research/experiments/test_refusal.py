"""`refusal.py`: the refusal rule read on a judge grid's records."""

import pytest

from research.experiments.refusal import refusal_choice


def _refused(recalls: dict[str, float]) -> dict:
    read = {"in_scope_accuracy_answering_all": 0.9, "in_scope_accuracy": 0.88}
    return {"params": {"refusals": {name: {**read, "recall": r} for name, r in recalls.items()}}}


def test_the_refusal_rule_asks_five_points_of_recall_and_no_run_below_confidence():
    runs = [
        _refused({"confidence": 0.70, "nearest": 0.80, "neighbours": 0.78}),
        _refused({"confidence": 0.60, "nearest": 0.66, "neighbours": 0.70}),
    ]
    read = refusal_choice(runs)
    assert read["chosen"] == "neighbours"  # +9.0 against nearest's +8.0: both qualify, the higher mean
    assert read["scores"]["nearest"]["gain"] == pytest.approx(8.0)
    assert read["scores"]["confidence"]["mean_cost"] == pytest.approx(2.0)
    runs[1] = _refused({"confidence": 0.60, "nearest": 0.80, "neighbours": 0.59})  # neighbours: a run below
    assert refusal_choice(runs)["chosen"] == "nearest"
    runs[0] = _refused({"confidence": 0.70, "nearest": 0.58, "neighbours": 0.90})  # nearest: +4.0
    assert refusal_choice(runs)["chosen"] == "confidence"
