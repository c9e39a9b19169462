"""How the two readers combine, read on a finished grid's kept distributions (`distributions.py`): the
rule in docs/experiments/two-readers.md, "How the readers combine", written before the records it reads.

Each candidate mixes one run's P_LM (the trained prompt, the `zero-shot` reading) with P_kNN (the
reader's book at knn-interp's k and T, the `book` reading), λ on LAMBDA_GRID chosen on dev; the chosen
mixture is then scored on the run's test split (the judge set, in a judge grid).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from openbook.selection import LAMBDA_GRID

FLOOR = 1e-4  # the kept distributions' rounding: a probability below it may read 0
Mix = Callable[[np.ndarray, np.ndarray, float], np.ndarray]


def linear(p_lm: np.ndarray, p_knn: np.ndarray, lam: float) -> np.ndarray:
    return lam * p_knn + (1 - lam) * p_lm


def geometric(p_lm: np.ndarray, p_knn: np.ndarray, lam: float) -> np.ndarray:
    """P ∝ P_LM^(1 − λ) · (P_kNN + FLOOR)^λ, a product of experts, rows renormalised."""
    log = (1 - lam) * np.log(np.maximum(p_lm, FLOOR)) + lam * np.log(p_knn + FLOOR)
    log -= log.max(axis=1, keepdims=True)
    p = np.exp(log)
    return p / p.sum(axis=1, keepdims=True)


def _scores(p: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean gold log-likelihood) over the in-scope rows (gold >= 0)."""
    inside = gold >= 0
    p, gold = p[inside], gold[inside]
    rows = np.arange(len(gold))
    return float((p.argmax(axis=1) == gold).mean()), float(np.log(np.maximum(p[rows, gold], FLOOR)).mean())


# name -> (mixture, what ranks λ on dev: "accuracy" (ties by the log-likelihood) or "log-likelihood")
CANDIDATES: dict[str, tuple[Mix, str]] = {
    "linear": (linear, "accuracy"),
    "linear-ll": (linear, "log-likelihood"),
    "geometric": (geometric, "accuracy"),
}
INCUMBENT = "linear"


def choose_lambda(p_lm: np.ndarray, p_knn: np.ndarray, gold: np.ndarray, mix: Mix, criterion: str) -> float:
    """The λ of LAMBDA_GRID that ranks first on (`p_lm`, `p_knn`, `gold`); the first of equals."""
    ranked = []
    for lam in LAMBDA_GRID:
        acc, ll = _scores(mix(p_lm, p_knn, lam), gold)
        ranked.append(((acc, ll) if criterion == "accuracy" else (ll,), lam))
    best = max(key for key, _ in ranked)
    return next(lam for key, lam in ranked if key == best)


def read_run(run: Mapping[str, Any], mix: Mix, criterion: str) -> dict[str, float]:
    """One run under one candidate: the λ chosen on dev and the test (judge) accuracy in %."""
    readings, gold = run["readings"], run["gold"]
    prompt, book = readings["zero-shot"], readings["book"]
    lam = choose_lambda(prompt["dev"], book["dev"], gold["dev"], mix, criterion)
    accuracy, _ = _scores(mix(prompt["test"], book["test"], lam), gold["test"])
    return {"lam": lam, "accuracy": 100 * accuracy}


def combine_table(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each candidate's mean test accuracy per task and over the runs, its mean λ, and the rule's verdict
    against INCUMBENT: a gain of at least 1.0 on the mean with no task more than 1.0 below."""
    tasks = sorted({run["task"] for run in runs})
    table: dict[str, dict[str, float]] = {}
    for name, (mix, criterion) in CANDIDATES.items():
        by_task: dict[str, list[float]] = defaultdict(list)
        lams = []
        for run in runs:
            read = read_run(run, mix, criterion)
            by_task[run["task"]].append(read["accuracy"])
            lams.append(read["lam"])
        table[name] = {t: float(np.mean(by_task[t])) for t in tasks}
        table[name]["mean"] = float(np.mean([a for t in tasks for a in by_task[t]]))
        table[name]["mean_lam"] = float(np.mean(lams))
    incumbent = table[INCUMBENT]
    verdicts = {}
    for name in CANDIDATES:
        if name == INCUMBENT:
            continue
        gain = table[name]["mean"] - incumbent["mean"]
        worst = min(table[name][t] - incumbent[t] for t in tasks)
        verdicts[name] = {"gain": gain, "worst_task": worst, "replaces": gain >= 1.0 and worst >= -1.0}
    qualified = [name for name, v in verdicts.items() if v["replaces"]]
    chosen = max(qualified, key=lambda name: table[name]["mean"]) if qualified else INCUMBENT
    return {"runs": len(runs), "tasks": tasks, "table": table, "verdicts": verdicts, "chosen": chosen}
