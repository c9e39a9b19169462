from __future__ import annotations

from openbook.training import DevScore

from services.trainer.gate import loses


def test_a_candidate_loses_on_accuracy_then_on_likelihood_and_a_full_tie_promotes() -> None:
    serving = DevScore(None, accuracy=1.0, log_likelihood=-0.2)
    assert loses(DevScore(None, 0.5, -0.01), serving)  # less accurate, however sure
    assert loses(
        DevScore(None, 1.0, -0.6), serving
    )  # as accurate on a handful of examples, less sure of the gold
    assert not loses(DevScore(None, 1.0, -0.2), serving)  # at least as well: it serves
    assert not loses(DevScore(None, 1.0, -0.1), serving)
    assert not loses(None, serving) and not loses(DevScore(None, 0.0, -9.0), None)  # nothing to compare
