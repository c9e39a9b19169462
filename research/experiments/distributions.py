"""Each reader's distributions of a trained run, kept beside its record so that a rule on how the readers
combine can be read on a finished grid without training again.

A trained run with a sentence reader (`eval --reader --keep-distributions`) writes
`distributions/<task>-<seed>.json.gz` in its `--out`: the gold label indices of dev and test
(OUT_OF_SCOPE rows included, as in the records) and, for each reading, its probabilities on both under
the settings dev chose for it (k, T and λ, in `params`). Readings: `zero-shot` (P_LM, the trained prompt
alone), `knn` and `knn-interp` over the reader's book, `book` (the reader's P_kNN at knn-interp's k and
T: what its λ mixes in), and `slot:knn` and `slot:knn-interp` over the slot store. Probabilities are
rounded to 4 decimals: some 50 kB a run of 500 test texts and 6 labels, gzipped, but 8 MB at 150
labels, hence asked for.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from research.experiments.evaluation import MethodResult

DIRECTORY = "distributions"


def _rounded(p: np.ndarray | None) -> list[list[float]] | None:
    return None if p is None else np.round(np.asarray(p, dtype=np.float64), 4).tolist()


def path_of(out: Path, task: str, seed: int) -> Path:
    return out / DIRECTORY / f"{task}-{seed}.json.gz"


def write_distributions(
    out: Path,
    task: str,
    seed: int,
    labels: list[str],
    readings: Mapping[str, MethodResult],
    gold: Mapping[str, np.ndarray | None],  # "dev" and "test": label indices (None: a dev-only run)
) -> Path:
    """Write one run's file (replacing an earlier one of the same task and seed); returns its path."""
    record = {
        "task": task,
        "seed": seed,
        "labels": labels,
        "gold": {split: None if g is None else np.asarray(g).tolist() for split, g in gold.items()},
        "readings": {
            name: {
                "dev": _rounded(result.p_dev),
                "test": _rounded(result.p_test),
                "params": {k: v for k, v in result.params.items() if isinstance(v, (int, float, str))},
            }
            for name, result in readings.items()
        },
    }
    path = path_of(out, task, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with gzip.open(partial, "wt") as f:
        json.dump(record, f)
    partial.replace(path)  # a grid stopped mid-write leaves no half file under the final name
    return path


def read_distributions(out: Path) -> list[dict[str, Any]]:
    """Every run's distributions in `out`, their arrays as numpy arrays, sorted by task and seed."""
    runs = []
    for path in sorted((out / DIRECTORY).glob("*.json.gz")):
        with gzip.open(path, "rt") as f:
            record = json.load(f)
        record["gold"] = {k: None if v is None else np.array(v) for k, v in record["gold"].items()}
        for reading in record["readings"].values():
            for split in ("dev", "test"):
                if reading[split] is not None:
                    reading[split] = np.array(reading[split])
        runs.append(record)
    return sorted(runs, key=lambda r: (r["task"], r["seed"]))
