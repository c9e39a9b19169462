"""The refusal rule (docs/experiments/two-readers.md, "Refusing out-of-scope queries by the reader's
neighbours"), read on the held-out-intents judge's records (`research/held_out_intents.py`), each of
which holds every refusal score's out-of-scope reading (`params.refusals`, `evaluation.refusals_on_test`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

REFUSAL_INCUMBENT = "confidence"


def refusal_choice(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The refusal rule (docs/experiments/two-readers.md, "Refusing out-of-scope queries by the reader's
    neighbours"), on the held-out-intents judge's records (each with `params.refusals`): a score replaces
    `confidence` if its mean out-of-scope recall is at least confidence's + 5 points and no run's is
    below confidence's; of two that do, the higher mean. Recall in %, per run and on the mean."""
    runs = [r for r in records if "refusals" in r["params"]]
    names = list(runs[0]["params"]["refusals"]) if runs else [REFUSAL_INCUMBENT]
    recall = {n: [100 * r["params"]["refusals"][n]["recall"] for r in runs] for n in names}
    cost = {
        n: [
            100 * (r["params"]["refusals"][n]["in_scope_accuracy_answering_all"]
                   - r["params"]["refusals"][n]["in_scope_accuracy"])
            for r in runs
        ]
        for n in names
    }  # fmt: skip
    base = recall[REFUSAL_INCUMBENT]
    mean = {n: _mean(recall[n]) for n in names}
    gain = {n: mean[n] - mean[REFUSAL_INCUMBENT] for n in names}
    none_below = {n: all(a >= b for a, b in zip(recall[n], base, strict=True)) for n in names}
    qualified = [n for n in names if n != REFUSAL_INCUMBENT and gain[n] >= 5.0 and none_below[n]]
    chosen = max(qualified, key=lambda n: mean[n]) if qualified else REFUSAL_INCUMBENT
    read = {
        n: {
            "mean_recall": mean[n],
            "mean_cost": _mean(cost[n]),
            "recalls": recall[n],
            "gain": gain[n],
            "no_run_below": none_below[n],
        }
        for n in names
    }
    return {"runs": len(runs), "scores": read, "chosen": chosen}


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")
