"""What a task serves after one job, read on test: the service's own figure beside the lab's grids.

The lab's grids (`research eval`) train on a seed's k-shot training split and choose on its dev split
given apart. A service task has no dev given apart: its job holds a share of the posted examples out by a
hash of their ids, chooses on them, and then tunes the served reader again on every example
(`fitting.py`, steps 0-3a), with the refusal threshold chosen before that second tuning carried over.
`served_run` fits a seed's training split so, through the library's `Estimator.fit` (the pipeline the
trainer runs), the examples under their positions as ids (as `openbook bench job` posts them), and reads
the version it would publish on the task's test split and, where the task has them, its out-of-scope
queries: accuracy answering all, and the refusals `Prediction.out_of_scope` makes (the service refuses
them where the task's `refuse_out_of_scope` is on).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from openbook.classifier import Classifier
from openbook.data import KShotSplits
from openbook.estimator import Estimator
from openbook.methods import build_method
from openbook.out_of_scope import out_of_scope_scores
from openbook.train_config import TrainConfig


def served_run(
    classifier: Classifier,
    method: str,
    splits: KShotSplits,
    config: TrainConfig,
    *,
    at_lams: Sequence[float] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """`classifier` (untrained, its reader untuned) fitted on `splits.train` as a service job fits it,
    under `config` (its seed included), then read on `splits.test` and `splits.out_of_scope`; and on
    `splits.test` again at each of `at_lams` in place of the λ the job chose (`at_lam`: one fit, so the
    readings differ by λ alone; the argmax, so the confidence temperature does not matter)."""
    assert splits.test is not None
    estimator = Estimator(classifier, build_method(method))
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "seed"}
    started = time.perf_counter()
    report = estimator.fit(
        [e.text for e in splits.train],
        [e.label for e in splits.train],
        seed=config.seed,
        progress=progress,
        **options,
    )
    fit_seconds = time.perf_counter() - started
    served = estimator.classifier
    embedded = served.embed([e.text for e in splits.test], progress=progress)  # once, for every reading
    test = served.explain(embedded)
    correct = np.array([p.label == e.label for p, e in zip(test, splits.test, strict=True)])
    record: dict[str, Any] = {
        "examples": len(splits.train),
        "train": len(report.train_ids),
        "dev": len(report.dev_ids),
        "fit_seconds": round(fit_seconds, 1),
        "dev_accuracy": report.dev_accuracy,
        "lam": served.knn.lam,
        "min_similarity": served.min_similarity,
        "reader_tuned_on": report.dev_metrics.get("reader_tuned_on"),
        "accuracy": float(correct.mean()),
        "test_examples": len(splits.test),
        "labels": len(served.labels),
    }
    if at_lams:
        gold = served.label_indices([e.label for e in splits.test])
        record["at_lam"] = {
            str(lam): float(
                np.mean(
                    served.score(embedded, knn=replace(served.knn, lam=lam)).probabilities.argmax(1) == gold
                )
            )
            for lam in at_lams
        }
    if splits.out_of_scope:
        outside = served.predict([e.text for e in splits.out_of_scope], progress=progress)
        # out_of_scope_scores thresholds a score; here each query's is 0 where the version refuses it
        in_scope = np.array([0.0 if p.out_of_scope else 1.0 for p in test])
        out_of_scope = np.array([0.0 if p.out_of_scope else 1.0 for p in outside])
        scores = dataclasses.asdict(out_of_scope_scores(in_scope, correct, out_of_scope, 0.5))
        del scores["threshold"]
        record["out_of_scope"] = scores | {"examples": len(splits.out_of_scope)}
    return record
