"""The first-use check: how an untrained task classifies from its first few examples, on dev only.

A task created over HTTP answers before any training job has run: P = λ·P_kNN + (1 − λ)·P_LM with the
task's kNN settings (`KnnConfig`), P_LM calibrated by a label prior. Which prior an untrained task should
use once it holds examples is the open choice: the content-free one (no data needed), or the domain one,
the mean prediction over the texts of the examples in its store (their labels unused).

For each seed, `per_class` examples of each class are drawn from the 16-shot training split (a seeded
permutation per class, so the 2-per-class draw is part of the 4-per-class one) into an empty store, and
the seed's dev split is scored under each calibration, with λ either the task's default or chosen by
the frozen prompt's rule on the store's own examples, each scored leave-one-out
(`selection.lambda_on_store`). With a sentence reader (`--reader`), P_kNN reads the drawn examples' book
in its space, untuned, as a new task's does.
The test split is never read.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from openbook.calibration import CalibrationMode, mean_prediction_bias
from openbook.classifier import Classifier
from openbook.data import Example, example_labels
from openbook.knn import DEFAULT_KNN
from openbook.predictions import Embeddings
from openbook.selection import lambda_on_store

FIRST_USE_CALIBRATIONS: tuple[CalibrationMode, ...] = ("content-free", "domain")
LAMBDA_RULES = ("default", "leave-one-out")


@dataclasses.dataclass(frozen=True)
class FirstUseRecord:
    task: str
    seed: int
    per_class: int
    calibration: CalibrationMode
    lam_rule: str  # "default": the task's λ; "leave-one-out": chosen on the store's examples
    lam: float
    served: float  # dev accuracy of the interpolated prediction a task serves untrained
    p_lm: float  # of the calibrated prompt alone
    p_knn: float  # of the store alone (the same under every calibration)


def draw_per_class(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Indices of `per_class` examples of each label (all of a smaller class), nested across counts."""
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    rng = np.random.default_rng(seed)
    drawn = [rng.permutation(np.flatnonzero(labels == label))[:per_class] for label in np.unique(labels)]
    return np.sort(np.concatenate(drawn))


def subset(embeddings: Embeddings, rows: np.ndarray) -> Embeddings:
    return Embeddings(embeddings.vectors[rows], embeddings.lm_log_probs[rows], embeddings.truncated[rows])


def check_seed(
    classifier: Classifier,
    task: str,
    seed: int,
    train: Sequence[Example],
    dev: Sequence[Example],
    per_class: Sequence[int],
) -> list[FirstUseRecord]:
    """Every (count per class, calibration) on one seed; `classifier` is untrained and its store is reset."""
    train_labels = example_labels(classifier, list(train))
    dev_labels = example_labels(classifier, list(dev))
    train_embedded = classifier.embed([e.text for e in train], vectors_only=True)
    dev_embedded = classifier.embed([e.text for e in dev])
    content_free = classifier.calibration_bias("content-free")
    records = []
    for count in per_class:
        rows = draw_per_class(train_labels, count, seed)
        drawn = subset(train_embedded, rows)
        classifier.store = classifier.empty_store()
        ids = classifier.add_embeddings(  # with their texts: a sentence reader keys its book by them
            drawn, [classifier.labels[i] for i in train_labels[rows]], texts=[train[i].text for i in rows]
        )
        biases = {"content-free": content_free, "domain": mean_prediction_bias(drawn.lm_log_probs)}
        for calibration in FIRST_USE_CALIBRATIONS:
            classifier.label_bias = biases[calibration]
            for lam_rule in LAMBDA_RULES:
                knn = dataclasses.replace(classifier.knn, lam=DEFAULT_KNN.lam)  # "default": the fixed λ
                if lam_rule == "leave-one-out":
                    knn = lambda_on_store(classifier, ids, drawn.lm_log_probs)
                assert knn.lam is not None
                scores = classifier.score(dev_embedded, knn=knn)
                accuracy = lambda p: float(np.mean(p.argmax(1) == dev_labels))  # noqa: E731
                records.append(
                    FirstUseRecord(
                        task=task,
                        seed=seed,
                        per_class=count,
                        calibration=calibration,
                        lam_rule=lam_rule,
                        lam=knn.lam,
                        served=accuracy(scores.probabilities),
                        p_lm=accuracy(scores.p_lm),
                        p_knn=accuracy(scores.p_knn),
                    )
                )
    classifier.store = classifier.empty_store()
    return records


def first_use_table(records: Sequence[FirstUseRecord]) -> str:
    """Dev accuracy in %, mean over seeds, of the served prediction (P_LM alone / P_kNN alone beside it)."""
    tasks = list(dict.fromkeys(r.task for r in records))
    counts = sorted({r.per_class for r in records})
    header = "| examples per class | calibration | λ | " + " | ".join(tasks) + " | mean |"
    lines = [header, "|" + "---|" * (len(tasks) + 4)]

    def mean(values: Sequence[float]) -> float:
        return 100 * float(np.mean(values))

    for count in counts:
        for calibration, lam_rule in itertools.product(FIRST_USE_CALIBRATIONS, LAMBDA_RULES):
            chosen = [
                r
                for r in records
                if (r.per_class, r.calibration, r.lam_rule) == (count, calibration, lam_rule)
            ]
            cells, task_means = [], []
            for task in tasks:
                mine = [r for r in chosen if r.task == task]
                task_means.append(mean([r.served for r in mine]))
                alone = f"{mean([r.p_lm for r in mine]):.1f} / {mean([r.p_knn for r in mine]):.1f}"
                cells.append(f"{task_means[-1]:.1f} ({alone})")
            lam = f"{chosen[0].lam:g}"
            if lam_rule == "leave-one-out":
                lam = f"LOO, mean {np.mean([r.lam for r in chosen]):.2f}"
            lines.append(
                f"| {count} | {calibration} | {lam} | "
                + " | ".join(cells)
                + f" | {float(np.mean(task_means)):.1f} |"
            )
    return "\n".join(lines) + "\n"
