"""The promotion gate: a trained candidate serves only if it does at least as well as the serving version.

Both are scored on the same dev examples (a stable hash of the example id puts one in four in dev, see
worker.split_dev) by the final prediction, kNN interpolation included, each with a store of the train
examples alone embedded by its own weights, so no dev example is its own neighbour
(openbook.fitting.dev_check). They are ranked by accuracy, and an accuracy tie by the mean
log-likelihood of the gold labels; only a full tie promotes. Dev starts with a handful of examples
(two per class labelled puts about one in dev), where accuracies tie often: in the learning-curve
benchmark a candidate and the serving model both scored 2 of 2, and the tie promoted a candidate 21
points worse on test. The likelihood is the smooth part of the same evidence that separates them.

A task's first candidate has no version to beat, but it replaces something all the same: the untrained
task, which serves until a version does (the prompt and kNN over the stored examples). On the default
backbone's learning curve a first version served 16 points below it. So the untrained task stands as the
serving side of the first gate, scored the same way: a store of the train examples, its calibration and
its lambda chosen on that store as the api chooses it (`untrained_score`), on the same dev examples.

A serving version whose sentence reader was tuned again on every example it held (`fitting`'s step 3a)
has learnt the labels of that job's dev examples, which stay in dev for every later job (`dev_split`): on
them it would judge its own lessons. So the two are compared on the dev examples the serving version did
not learn (`learnt_by`); `dev` counts them, `left_out` the rest. Before this, on the two readers' learning
curve, the serving side scored 1.0 against a candidate's 0.94 on such a dev, and 3 of 8 later jobs were
rejected (docs/experiments/two-readers.md, "The gate and the served reader").

Verdicts: `promoted` (at least as well), `rejected` (worse: kept as a version, never published),
`forced` (the job asked to skip the gate), `first` (nothing serves yet, and it does at least as well as
the untrained task). With no dev example, there is nothing to compare: the scores are None, and the
candidate is promoted. A dev set that lacks a label scores on the labels it has.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from openbook.artifacts import MANIFEST_NAME, CheckpointError
from openbook.backbone import Backbone
from openbook.checkpoints import load_classifier
from openbook.classifier import Classifier
from openbook.fitting import LabelledTexts, StoreExamples, dev_check, served_dev_score
from openbook.labels import LabelError, fit_to_labels
from openbook.prompting import TextInput
from openbook.quality import Scored
from openbook.training import DevScore

from services.bus.versions import Published
from services.engine.task_spec import Task, task_classifier

logger = logging.getLogger(__name__)

METRIC = "accuracy, then gold log-likelihood"
Examples = dict[int, tuple[TextInput, str]]


def load_serving(published: Published, task: Task, device: str) -> Classifier:
    """The classifier of the task's serving checkpoint, to score on the task as it is now.

    A checkpoint trained before labels were added to the task grows to them (openbook.labels), as the
    api's hot swap does, so it is scored on the same label set as the candidate.
    """
    classifier, _ = load_classifier(published.path, device=device)  # verifies every file's sha256
    return fit_to_labels(classifier, task.labels)


def learnt_by(published: Published, classifier: Classifier) -> set[int]:
    """The ids of the examples outside its train part whose labels the published version (`classifier`,
    loaded from it) learnt: every example its store holds where its sentence reader was tuned again on them
    all (`reader_tuned_on` in its dev metrics), else none (its prompt learnt its train part alone)."""
    manifest = json.loads((Path(published.path) / MANIFEST_NAME).read_text())
    if manifest.get("dev_metrics", {}).get("reader_tuned_on") is None:
        return set()
    return {int(i) for i in classifier.store.ids()}


def score(
    classifier: Classifier, examples: Examples, train_ids: list[int], dev_ids: list[int]
) -> DevScore | None:
    """`classifier` scored on dev with a store of the train examples only; None with no dev example."""
    train = StoreExamples(
        [examples[i][0] for i in train_ids], [examples[i][1] for i in train_ids], np.array(train_ids)
    )
    dev = LabelledTexts(
        [examples[i][0] for i in dev_ids], classifier.label_indices([examples[i][1] for i in dev_ids])
    )
    return dev_check(classifier, train, dev)


def untrained_score(
    task: Task, backbone: Backbone, examples: Examples, train_ids: list[int], dev_ids: list[int]
) -> DevScore | None:
    """The untrained task scored as a candidate is: None with no dev example. Run it before training
    changes `backbone`'s weights. With `knn.lam` null its classifier chooses λ on the store it is scored
    with, of the train examples, as the api's untrained task chooses it on its own (openbook.lambda_on_store).
    """
    if not dev_ids:
        return None
    return score(task_classifier(task, backbone), examples, train_ids, dev_ids)


def judge(
    candidate: Classifier,
    serving: Published | None,
    task: Task,
    device: str,
    examples: Examples,
    train_ids: list[int],
    dev_ids: list[int],
    *,
    force: bool = False,
    untrained: DevScore | None = None,
    candidate_dev: Scored | None = None,
) -> dict[str, Any]:
    """The gate's record: {metric, candidate, serving (dev accuracies), their log-likelihoods,
    serving_version, dev (the examples compared), left_out (dev examples the serving version learnt),
    verdict}; for a first candidate, `untrained` (`untrained_score`) is the serving side, recorded as
    `serving` with `serving_version` null. `candidate_dev`: dev as the candidate serves it, as its
    training already scored it before calibration (`FitReport.dev_scores`), read on the examples
    compared (`fitting.served_dev_score`); without it the candidate is scored here."""
    rival, compared = None, dev_ids
    if serving is not None and not force:
        try:
            rival = load_serving(serving, task, device)
        except (CheckpointError, LabelError) as error:  # gone, damaged or on other labels: not comparable
            logger.warning("task %s: the serving version cannot be scored: %s", task.name, error)
        else:
            learnt = learnt_by(serving, rival)
            compared = [i for i in dev_ids if i not in learnt]
    if not compared:
        candidate_score = None
    elif candidate_dev is not None:
        candidate_score = served_dev_score(candidate_dev, candidate.confidence_temperature, compared)
    else:
        candidate_score = score(candidate, examples, train_ids, compared)
    serving_score = None
    if force:
        verdict = "forced"
    elif serving is None:
        serving_score = untrained
        verdict = "rejected" if loses(candidate_score, untrained) else "first"
    else:
        if rival is not None:
            serving_score = score(rival, examples, train_ids, compared)
        verdict = "rejected" if loses(candidate_score, serving_score) else "promoted"
    return {
        "metric": METRIC,
        "candidate": _rounded(candidate_score, "accuracy"),
        "serving": _rounded(serving_score, "accuracy"),
        "candidate_log_likelihood": _rounded(candidate_score, "log_likelihood"),
        "serving_log_likelihood": _rounded(serving_score, "log_likelihood"),
        "serving_version": None if serving is None else serving.version,
        "dev": len(compared),
        "left_out": len(dev_ids) - len(compared),
        "verdict": verdict,
    }


def loses(candidate: DevScore | None, serving: DevScore | None) -> bool:
    """Whether the candidate does worse than the serving version; with nothing to compare, it does not."""
    return candidate is not None and serving is not None and candidate.key() < serving.key()


def _rounded(check: DevScore | None, field: str) -> float | None:
    """A score as the records keep it: 6 decimals, which the version record's Lua JSON keeps exactly."""
    return None if check is None else round(getattr(check, field), 6)
