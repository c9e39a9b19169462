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

Verdicts: `promoted` (at least as well), `rejected` (worse: kept as a version, never published),
`forced` (the job asked to skip the gate), `first` (nothing serves yet, and it does at least as well as
the untrained task). With no dev example, there is nothing to compare: the scores are None, and the
candidate is promoted. A dev set that lacks a label scores on the labels it has.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from openbook.artifacts import CheckpointError
from openbook.backbone import Backbone
from openbook.checkpoints import load_classifier
from openbook.classifier import Classifier
from openbook.fitting import LabelledTexts, StoreExamples, dev_check
from openbook.labels import LabelError, fit_to_labels
from openbook.prompting import TextInput
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
    candidate_score: DevScore | None = None,
) -> dict[str, Any]:
    """The gate's record: {metric, candidate, serving (dev accuracies), their log-likelihoods,
    serving_version, dev, verdict}; for a first candidate, `untrained` (`untrained_score`) is the
    serving side, recorded as `serving` with `serving_version` null. `candidate_score`: the candidate's
    score as its training already took it (`fitting.served_dev_score`); scored here when not given."""
    if candidate_score is None:
        candidate_score = score(candidate, examples, train_ids, dev_ids)
    serving_score = None
    if force:
        verdict = "forced"
    elif serving is None:
        serving_score = untrained
        verdict = "rejected" if loses(candidate_score, untrained) else "first"
    else:
        try:
            serving_score = score(load_serving(serving, task, device), examples, train_ids, dev_ids)
        except (CheckpointError, LabelError) as error:  # gone, damaged or on other labels: not comparable
            logger.warning("task %s: the serving version cannot be scored: %s", task.name, error)
        verdict = "rejected" if loses(candidate_score, serving_score) else "promoted"
    return {
        "metric": METRIC,
        "candidate": _rounded(candidate_score, "accuracy"),
        "serving": _rounded(serving_score, "accuracy"),
        "candidate_log_likelihood": _rounded(candidate_score, "log_likelihood"),
        "serving_log_likelihood": _rounded(serving_score, "log_likelihood"),
        "serving_version": None if serving is None else serving.version,
        "dev": len(dev_ids),
        "verdict": verdict,
    }


def loses(candidate: DevScore | None, serving: DevScore | None) -> bool:
    """Whether the candidate does worse than the serving version; with nothing to compare, it does not."""
    return candidate is not None and serving is not None and candidate.key() < serving.key()


def _rounded(check: DevScore | None, field: str) -> float | None:
    """A score as the records keep it: 6 decimals, which the version record's Lua JSON keeps exactly."""
    return None if check is None else round(getattr(check, field), 6)
