"""The two readers' dev probes' rules and the readers judge's, each read from the records alone
(docs/experiments/two-readers.md): the rule of each probe as written before its grid ran. The runs
that make the records are `two_readers.py`'s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from research.experiments.two_readers import accuracy

N0_GRID: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, float("inf"))


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(np.mean(values)) if values else float("nan")


def variant_table(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Probe 1's reading: per (variant, shots) the mean dev accuracies and the median tuning seconds."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        groups[(record["variant"], record["shots"])].append(record)
    return [
        {
            "variant": variant,
            "shots": shots,
            "runs": len(group),
            **{key: _mean(r[key] for r in group) for key in ("lm", "frozen_knn", "knn", "logreg")},
            "tune_s_median": float(np.median([r["tune_s"] for r in group])),
        }
        for (variant, shots), group in sorted(groups.items())
    ]


def probe1_choice(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Probe 1's rule, as written before its grid: the variant with the higher mean dev kNN accuracy
    over its runs, unless the other is within 0.5 points and cheaper (median tuning seconds at 16 per
    class); kept only if its mean at 16 per class beats the frozen encoder's by 5 points."""
    by_variant: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_variant[record["variant"]].append(record)
    means = {v: _mean(r["knn"] for r in rs) for v, rs in by_variant.items()}
    cost = {
        v: float(np.median([r["tune_s"] for r in rs if r["shots"] == 16] or [np.nan]))
        for v, rs in by_variant.items()
    }
    best = max(means, key=lambda v: means[v])
    for other in means:
        if other != best and means[best] - means[other] <= 0.5 and cost[other] < cost[best]:
            best = other
    at16 = [r for r in by_variant[best] if r["shots"] == 16]
    gain = _mean(r["knn"] for r in at16) - _mean(r["frozen_knn"] for r in at16)
    return {
        "means": means,
        "median_tune_s_16": cost,
        "chosen": best,
        "gain_over_frozen_16": gain,
        "kept": gain >= 5,
    }


def probe3_choice(
    records: Sequence[Mapping[str, Any]],
    incumbent: str = "t4",
    candidates: Sequence[str] = ("t6", "t6s"),
    max_cost_ratio: float | None = 3.0,
) -> dict[str, Any]:
    """Probe 3's rule, as written before its grid: a candidate replaces `incumbent` if its kNN mean dev
    accuracy over the runs is at least the incumbent's + 1.0, no task's mean is more than 1.0 below
    the incumbent's, and its median tuning seconds are at most `max_cost_ratio` x the incumbent's (None:
    no bound; probe 6 bounds a job's cost instead); of two that do, the higher mean, unless the other is
    within 0.5 and cheaper."""
    runs: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        runs[record["variant"]].append(record)
    tasks = sorted({r["task"] for r in records})

    def summary(variant: str) -> dict[str, Any]:
        group = runs[variant]
        return {
            "runs": len(group),
            "mean": _mean(r["knn"] for r in group),
            "tasks": {t: _mean(r["knn"] for r in group if r["task"] == t) for t in tasks},
            "tune_s_median": float(np.median([r["tune_s"] for r in group])) if group else float("nan"),
        }

    read = {variant: summary(variant) for variant in (incumbent, *candidates)}
    base = read[incumbent]
    for variant in candidates:
        row = read[variant]
        row["gain"] = row["mean"] - base["mean"]
        row["worst_task"] = min(row["tasks"][t] - base["tasks"][t] for t in tasks)
        row["cost_ratio"] = row["tune_s_median"] / base["tune_s_median"]
        cheap_enough = max_cost_ratio is None or row["cost_ratio"] <= max_cost_ratio
        row["qualifies"] = row["gain"] >= 1.0 and row["worst_task"] >= -1.0 and cheap_enough
    qualified = sorted((v for v in candidates if read[v]["qualifies"]), key=lambda v: -read[v]["mean"])
    chosen = qualified[0] if qualified else incumbent
    for other in qualified[1:]:
        if read[chosen]["mean"] - read[other]["mean"] <= 0.5 and (
            read[other]["tune_s_median"] < read[chosen]["tune_s_median"]
        ):
            chosen = other
    return {"variants": read, "chosen": chosen}


def probe4_reading(records: Sequence[Mapping[str, Any]], kept_mean: float) -> dict[str, Any]:
    """Probe 4's rule: adapters over all layers are built if `t12`'s kNN mean dev accuracy is at least
    `kept_mean` (the reader probe 3 keeps) + 1.5."""
    mean = _mean(r["knn"] for r in records if r["variant"] == "t12")
    return {
        "t12_mean": mean,
        "kept_mean": kept_mean,
        "gain": mean - kept_mean,
        "build": mean - kept_mean >= 1.5,
    }


PROBE6_VARIANTS = ("a12", "a12h")


def probe6_choice(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Probe 6's rule: probe 3's, LoRA adapters over all 12 layers (`a12`, `a12h`) against the top 4
    layers in bfloat16 (`t4b`), with no bound on the tuning seconds (the adapters' cost is judged by the
    jobs, as the default, before it is taken)."""
    return probe3_choice(records, incumbent="t4b", candidates=PROBE6_VARIANTS, max_cost_ratio=None)


PROBE7_VARIANTS = ("s12", "s12r8")


def probe7_choice(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Probe 7's rule: each rank of all 12 layers tuned in full (`s12`: 32, `s12r8`: 8) qualifies as probe
    3's rule says against `t4b` (no bound on the tuning seconds); of two that do, rank 8 unless rank 32's
    mean is at least rank 8's + 0.5."""
    read = probe3_choice(records, incumbent="t4b", candidates=PROBE7_VARIANTS, max_cost_ratio=None)
    variants = read["variants"]
    qualified = [v for v in PROBE7_VARIANTS if variants[v]["qualifies"]]
    if len(qualified) == 2:
        read["chosen"] = "s12" if variants["s12"]["mean"] >= variants["s12r8"]["mean"] + 0.5 else "s12r8"
    return read


def probe5_reading(records: Sequence[Mapping[str, Any]], kept: str) -> dict[str, Any]:
    """Probe 5's rule: `kept` tuned in bfloat16 (variant `kept` + "b") is adopted where bfloat16 is native
    if its kNN mean dev accuracy is at most 0.5 below float32's, no task's more than 1.0, and its median
    tuning seconds at most float32's / 1.5."""
    runs = {v: [r for r in records if r["variant"] == v] for v in (kept, kept + "b")}
    tasks = sorted({r["task"] for r in runs[kept]})
    mean = {v: _mean(r["knn"] for r in rs) for v, rs in runs.items()}
    task_means = {
        v: {t: _mean(r["knn"] for r in rs if r["task"] == t) for t in tasks} for v, rs in runs.items()
    }
    seconds = {v: float(np.median([r["tune_s"] for r in rs])) for v, rs in runs.items()}
    loss = mean[kept + "b"] - mean[kept]
    worst = min(task_means[kept + "b"][t] - task_means[kept][t] for t in tasks)
    speed = seconds[kept] / seconds[kept + "b"]
    return {
        "runs": {v: len(rs) for v, rs in runs.items()},
        "change": loss,
        "worst_task": worst,
        "speed_up": speed,
        "adopted": loss >= -0.5 and worst >= -1.0 and speed >= 1.5,
    }


def mixed(record: Mapping[str, Any], reader: str, n0: float) -> np.ndarray:
    """P = w·P_enc + (1 − w)·P_LM with w = n / (n + n0) (n0 = 0: the encoder alone; inf: the prompt)."""
    n = record["shots"]
    w = 1.0 if n0 == 0 else 0.0 if np.isinf(n0) else n / (n + n0)
    return w * np.asarray(record["p"][reader]) + (1 - w) * np.asarray(record["p"]["lm"])


def mix_table(records: Sequence[Mapping[str, Any]], variant: str) -> dict[tuple[str, float], dict[str, Any]]:
    """Probe 2's grid over the runs of `variant`: per (reader, n0) the mean dev accuracy and the mean per
    (task, shots)."""
    runs = [r for r in records if r["variant"] == variant]
    table = {}
    for reader in ("knn", "logreg"):
        for n0 in N0_GRID:
            cells: dict[tuple[str, int], list[float]] = defaultdict(list)
            scores = []
            for record in runs:
                score = accuracy(mixed(record, reader, n0), np.asarray(record["gold"]))
                scores.append(score)
                cells[(record["task"], record["shots"])].append(score)
            table[(reader, n0)] = {"mean": _mean(scores), "cells": {k: _mean(v) for k, v in cells.items()}}
    return table


def probe2_choice(records: Sequence[Mapping[str, Any]], variant: str) -> dict[str, Any]:
    """Probe 2's rule, as written before it was read: the (reader, n0) of the highest mean is adopted if
    it beats the better single reader's mean by 1 point and loses more than 1 point to it in no
    (task, shots) cell."""
    table = mix_table(records, variant)
    singles = {key: row for key, row in table.items() if key[1] in (0.0, float("inf"))}
    best_single = max(singles, key=lambda key: singles[key]["mean"])
    best = max(table, key=lambda key: table[key]["mean"])
    worst_cell = min(
        table[best]["cells"][cell] - table[best_single]["cells"][cell] for cell in table[best]["cells"]
    )
    adopted = (
        best not in singles and table[best]["mean"] - table[best_single]["mean"] >= 1 and worst_cell >= -1
    )
    return {
        "table": table,
        "best": best,
        "best_single": best_single,
        "gain": table[best]["mean"] - table[best_single]["mean"],
        "worst_cell": worst_cell,
        "adopted": adopted,
    }


JUDGE_READINGS = {  # the judge table's columns: (where in a record's params, which reading)
    "slot store (incumbent)": ("slot_readings", "knn-interp"),
    "two readers": ("readings", "knn-interp"),
    "head-mix": ("readings", "head-mix"),
    "prompt alone": ("readings", "zero-shot"),
    "reader's kNN alone": ("readings", "knn"),
}
CANDIDATES = ("two readers", "head-mix")


def judge_table(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The default's rule read on the readers judge grid's records (docs/experiments/two-readers.md):
    per task and over the runs, each reading's mean judge accuracy (in %), and for each candidate
    criteria 1 (mean at least the incumbent's + 2) and 2 (no task's mean more than 1 below)."""
    tasks = sorted({r["task"] for r in records})
    table: dict[str, dict[str, float]] = {}
    for column, (where, reading) in JUDGE_READINGS.items():
        scores = {
            t: [100 * r["params"][where][reading]["accuracy"] for r in records if r["task"] == t]
            for t in tasks
        }
        table[column] = {t: _mean(v) for t, v in scores.items()} | {
            "mean": _mean(100 * r["params"][where][reading]["accuracy"] for r in records)
        }
    incumbent = table["slot store (incumbent)"]
    verdicts = {
        name: {
            "gain": table[name]["mean"] - incumbent["mean"],
            "worst_task": min(table[name][t] - incumbent[t] for t in tasks),
            "criteria_1_and_2": table[name]["mean"] - incumbent["mean"] >= 2
            and min(table[name][t] - incumbent[t] for t in tasks) >= -1,
        }
        for name in CANDIDATES
    }
    return {"runs": len(records), "tasks": tasks, "table": table, "verdicts": verdicts}


def probe8_reading(
    records: Sequence[Mapping[str, Any]], incumbent: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Probe 8's criterion 2 (docs/experiments/two-readers.md): the two readers of `records` (a judge grid
    with another reader's tuning) against those of `incumbent` (the same splits, the kept tuning), on the
    runs both hold: per task and over the runs, each side's mean judge accuracy in %, the gain on the mean
    (+0.5 asked) and the worst task's (-1.0 allowed)."""
    where, reading = JUDGE_READINGS["two readers"]

    def scores(grid: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
        return {(r["task"], r["seed"]): 100 * r["params"][where][reading]["accuracy"] for r in grid}

    candidate, kept = scores(records), scores(incumbent)
    runs = sorted(candidate.keys() & kept.keys())
    tasks = sorted({task for task, _ in runs})
    table = {
        name: {t: _mean(side[run] for run in runs if run[0] == t) for t in tasks}
        | {"mean": _mean(side[run] for run in runs)}
        for name, side in (("candidate", candidate), ("incumbent", kept))
    }
    gain = table["candidate"]["mean"] - table["incumbent"]["mean"]
    worst = min((table["candidate"][t] - table["incumbent"][t] for t in tasks), default=float("nan"))
    return {
        "runs": len(runs),
        "tasks": tasks,
        "table": table,
        "gain": gain,
        "worst_task": worst,
        "better_option": gain >= 0.5 and worst >= -1.0,
    }
