"""How good a task is: a report computed from scored examples, calibration, and abstention.

Everything here is array in, dataclass out. What is scored decides what the report means, and the
caller says which it was:

- the frozen parts (the prompt and the store) are scored leave-one-out (`leave_one_out`): every
  labelled example is classified with itself removed from the store, so it is never its own neighbour;
- a trained version is scored on its held-out dev split, scored when the version was made
  (`fitting.fit_classifier`) and stored with it.

The report (`quality_report`) holds accuracy, macro-F1, per-label precision/recall/F1, the confusion
matrix (rows are gold labels) and its largest off-diagonal cells (`confused_pairs`), the expected
calibration error with its reliability bins, the accuracy a confidence threshold buys on the share of
traffic it keeps (`coverage`), and the suspect examples: those
whose prediction puts most of its mass on another label than their own, most confident first. A
confident disagreement of an example with its own neighbours and prompt is what a label error looks like.

Confidence is the probability of the predicted label. Temperature scaling (Guo et al., ICML 2017)
rescales it: P_T = softmax(log P / T), which keeps every argmax. T is fitted by the gold labels'
log-likelihood; whether it helps is judged by cross-validation (`calibrate`), so the ECE reported after
calibration is never measured on the examples its temperature was fitted to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from openbook.calibration import with_temperature
from openbook.classifier import Classifier
from openbook.predictions import Embeddings
from openbook.prompting import TextInput

RELIABILITY_BINS = 10
COVERAGE_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(21))  # 0.0, 0.05, ..., 1.0
SUSPECT_CONFIDENCE = 0.5  # a suspect's prediction puts at least this much on a label not its own
CONFUSED_PAIRS = 10  # the most confused (labelled, predicted) pairs a report lists
MIN_CALIBRATION_EXAMPLES = 20  # fewer scored examples never adopt a temperature
_TEMPERATURES = np.exp(np.linspace(np.log(0.05), np.log(20.0), 121))  # the search grid of T
_FLOOR = 1e-12  # log P of a label given no probability at all


@dataclass(frozen=True)
class Scored:
    """Labelled examples and the distribution a classifier gave each; where the scoring kept them, each
    reader's own distribution too (P_LM, the prompt's; P_kNN, the stored examples' neighbours', None
    with an empty store)."""

    ids: np.ndarray  # (N,) int64
    gold: np.ndarray  # (N,) label indices
    probabilities: np.ndarray  # (N, C)
    p_lm: np.ndarray | None = None  # (N, C)
    p_knn: np.ndarray | None = None  # (N, C)

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.gold.shape != (n,) or self.probabilities.ndim != 2 or len(self.probabilities) != n:
            raise ValueError(
                f"ids {self.ids.shape}, gold {self.gold.shape} and probabilities "
                f"{self.probabilities.shape} do not describe the same examples"
            )
        for reader in (self.p_lm, self.p_knn):
            if reader is not None and reader.shape != self.probabilities.shape:
                shape = self.probabilities.shape
                raise ValueError(f"a reader's distributions {reader.shape} are not {shape}")

    @classmethod
    def concatenate(cls, parts: Sequence[Scored]) -> Scored:
        """The parts' examples, in order (at least one part); a reader's distributions are kept where
        every part has them."""

        def joined(name: str) -> np.ndarray | None:
            arrays = [getattr(part, name) for part in parts]
            return None if any(a is None for a in arrays) else np.concatenate(arrays)

        ids, gold, probabilities = (joined(name) for name in ("ids", "gold", "probabilities"))
        assert ids is not None and gold is not None and probabilities is not None  # never None
        return cls(ids, gold, probabilities, joined("p_lm"), joined("p_knn"))

    @property
    def predicted(self) -> np.ndarray:  # (N,)
        return self.probabilities.argmax(1)

    @property
    def confidence(self) -> np.ndarray:  # (N,) the probability of the predicted label
        return self.probabilities.max(1)


@dataclass(frozen=True)
class LabelScores:
    precision: float
    recall: float
    f1: float
    support: int  # gold examples of the label


@dataclass(frozen=True)
class ReliabilityBin:
    lower: float
    upper: float
    count: int
    confidence: float | None  # mean confidence in the bin; None when it is empty
    accuracy: float | None


@dataclass(frozen=True)
class CoveragePoint:
    threshold: float
    coverage: float  # share of the examples whose confidence is at least `threshold`
    accuracy: float | None  # accuracy on those; None when none is kept


@dataclass(frozen=True)
class Suspect:
    id: int
    label: str  # as labelled
    predicted: str
    confidence: float  # the probability of `predicted`


@dataclass(frozen=True)
class ConfusedPair:
    label: str  # as labelled
    predicted: str
    count: int  # examples of `label` predicted as `predicted`


@dataclass(frozen=True)
class Readers:
    """Each reader alone on the scored examples, beside the served prediction (the report's accuracy):
    the prompt (P_LM), the book (P_kNN over the stored examples, keyed by `book_keyed_by`: a sentence
    reader's name, or the prompt's slot vectors) and the weight λ the served prediction gives the book."""

    prompt: float | None  # accuracy of P_LM alone; None where not recorded
    book: float | None  # accuracy of P_kNN alone; None with an empty store or none recorded
    lam: float | None  # None where not recorded
    book_keyed_by: str


SLOT_VECTORS = "slot vectors"  # what keys the book of a task without a sentence reader


def readers_of(scored: Scored, lam: float | None, book_keyed_by: str) -> Readers:
    """`Readers` from the distributions `scored` kept (an untrained task's leave-one-out pass)."""

    def accuracy(p: np.ndarray | None) -> float | None:
        return None if p is None or len(p) == 0 else float(np.mean(p.argmax(1) == scored.gold))

    return Readers(accuracy(scored.p_lm), accuracy(scored.p_knn), lam, book_keyed_by)


def readers_on_dev(manifest: dict[str, Any]) -> Readers | None:
    """`Readers` of a trained version, from what its checkpoint's manifest recorded of dev: the prompt's
    accuracy alone (`accuracy`), the neighbours' (`accuracy_knn_alone`) and the served λ. None where the
    version was trained without dev."""
    metrics = manifest.get("dev_metrics") or {}
    if "accuracy" not in metrics:
        return None
    reader = manifest.get("reader")
    keyed_by = SLOT_VECTORS if reader is None else str(reader["base"]["name"])
    lam = (manifest.get("knn") or {}).get("lam")
    return Readers(metrics["accuracy"], metrics.get("accuracy_knn_alone"), lam, keyed_by)


@dataclass(frozen=True)
class QualityReport:
    examples: int
    labels: tuple[str, ...]
    accuracy: float
    macro_f1: float
    per_label: dict[str, LabelScores]
    confusion: np.ndarray  # (C, C) counts, rows gold, columns predicted
    ece: float
    reliability: tuple[ReliabilityBin, ...]
    coverage: tuple[CoveragePoint, ...]
    suspects: tuple[Suspect, ...]
    confused_pairs: tuple[ConfusedPair, ...]


def confusion_matrix(gold: np.ndarray, predicted: np.ndarray, num_labels: int) -> np.ndarray:
    """(C, C) counts: row = gold label, column = predicted label."""
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (gold, predicted), 1)
    return matrix


def per_label_scores(confusion: np.ndarray, labels: Sequence[str]) -> dict[str, LabelScores]:
    """Precision, recall and F1 of each label from the confusion matrix (0 where undefined)."""
    true_positives = np.diag(confusion).astype(float)
    predicted, support = confusion.sum(0), confusion.sum(1)
    precision = np.divide(true_positives, predicted, out=np.zeros_like(true_positives), where=predicted > 0)
    recall = np.divide(true_positives, support, out=np.zeros_like(true_positives), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(total), where=total > 0)
    return {
        label: LabelScores(float(precision[c]), float(recall[c]), float(f1[c]), int(support[c]))
        for c, label in enumerate(labels)
    }


def most_confused(
    confusion: np.ndarray, labels: Sequence[str], limit: int = CONFUSED_PAIRS
) -> tuple[ConfusedPair, ...]:
    """The off-diagonal cells of `confusion` with the most examples, most first (ties in label order): with
    many labels, where a task errs reads from this list, not from a C x C matrix."""
    errors = confusion.copy()
    np.fill_diagonal(errors, 0)
    flat = errors.ravel()
    order = np.argsort(-flat, kind="stable")[:limit]
    order = order[flat[order] > 0]
    rows, columns = np.unravel_index(order, errors.shape)
    return tuple(
        ConfusedPair(labels[int(g)], labels[int(p)], int(errors[g, p]))
        for g, p in zip(rows, columns, strict=True)
    )


def reliability(scored: Scored, bins: int = RELIABILITY_BINS) -> tuple[float, tuple[ReliabilityBin, ...]]:
    """(ECE, bins): confidence in `bins` equal-width bins over [0, 1]; ECE = sum over bins of
    (count / N) * |accuracy - mean confidence|."""
    confidence, correct = scored.confidence, scored.predicted == scored.gold
    index = np.minimum((confidence * bins).astype(np.int64), bins - 1)  # confidence 1.0 in the last bin
    table, ece = [], 0.0
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        mean_confidence = float(confidence[members].mean()) if count else None
        accuracy = float(correct[members].mean()) if count else None
        if count:
            ece += count / len(confidence) * abs(accuracy - mean_confidence)  # type: ignore[operator]
        table.append(ReliabilityBin(b / bins, (b + 1) / bins, count, mean_confidence, accuracy))
    return float(ece), tuple(table)


def coverage_curve(
    scored: Scored, thresholds: Sequence[float] = COVERAGE_THRESHOLDS
) -> tuple[CoveragePoint, ...]:
    """For each threshold, the share of examples answered (confidence >= threshold) and their accuracy."""
    confidence, correct = scored.confidence, scored.predicted == scored.gold
    points = []
    for threshold in thresholds:
        kept = confidence >= threshold
        accuracy = float(correct[kept].mean()) if kept.any() else None
        points.append(CoveragePoint(float(threshold), float(kept.mean()), accuracy))
    return tuple(points)


def suspects(
    scored: Scored, labels: Sequence[str], min_confidence: float = SUSPECT_CONFIDENCE, limit: int = 50
) -> tuple[Suspect, ...]:
    """Examples predicted as another label with at least `min_confidence`, most confident first."""
    predicted, confidence = scored.predicted, scored.confidence
    wrong = np.flatnonzero((predicted != scored.gold) & (confidence >= min_confidence))
    order = wrong[np.argsort(-confidence[wrong], kind="stable")][:limit]
    return tuple(
        Suspect(
            int(scored.ids[i]), labels[int(scored.gold[i])], labels[int(predicted[i])], float(confidence[i])
        )
        for i in order
    )


def quality_report(scored: Scored, labels: Sequence[str], *, suspect_limit: int = 50) -> QualityReport:
    """The whole report of `scored` examples; ValueError when there is none."""
    if len(scored.ids) == 0:
        raise ValueError("no scored example to report on")
    labels = tuple(labels)
    confusion = confusion_matrix(scored.gold, scored.predicted, len(labels))
    per_label = per_label_scores(confusion, labels)
    present = [scores.f1 for scores in per_label.values() if scores.support > 0]
    ece, bins = reliability(scored)
    return QualityReport(
        examples=len(scored.ids),
        labels=labels,
        accuracy=float(np.trace(confusion) / confusion.sum()),
        macro_f1=float(np.mean(present)),  # over the labels that have gold examples
        per_label=per_label,
        confusion=confusion,
        ece=ece,
        reliability=bins,
        coverage=coverage_curve(scored),
        suspects=suspects(scored, labels, limit=suspect_limit),
        confused_pairs=most_confused(confusion, labels),
    )


def threshold_for_accuracy(coverage: Sequence[CoveragePoint], target: float) -> CoveragePoint | None:
    """The lowest threshold whose kept examples reach `target` accuracy (the most traffic kept), if any."""
    for point in coverage:
        if point.accuracy is not None and point.accuracy >= target:
            return point
    return None


# --- calibration --------------------------------------------------------------------------------------


def fit_temperature(probabilities: np.ndarray, gold: np.ndarray) -> float:
    """The T on a log-spaced grid (0.05 to 20) that maximises the gold labels' mean log-likelihood."""
    log_p = np.log(np.maximum(probabilities, _FLOOR)).astype(np.float64)  # (N, C)
    logits = log_p[None] / _TEMPERATURES[:, None, None]  # (G, N, C)
    log_norm = np.logaddexp.reduce(logits, axis=2)  # (G, N)
    gold_logits = np.take_along_axis(logits, gold[None, :, None].repeat(len(_TEMPERATURES), 0), 2)[..., 0]
    likelihood = (gold_logits - log_norm).mean(1)  # (G,)
    return float(_TEMPERATURES[int(np.argmax(likelihood))])


@dataclass(frozen=True)
class Calibration:
    temperature: float  # fitted on every scored example; 1.0 when not adopted
    fitted_temperature: float  # what the fit found, adopted or not
    ece_before: float
    ece_after: float  # of the temperatures fitted without each fold's examples, on that fold
    adopted: bool  # ece_after < ece_before, with at least MIN_CALIBRATION_EXAMPLES examples
    folds: int


def calibrate(scored: Scored, folds: int = 5, seed: int = 0) -> Calibration:
    """Temperature scaling, adopted only if it lowers the ECE on examples it was not fitted to, and only
    from `MIN_CALIBRATION_EXAMPLES` scored examples on (below, a fit is noise: it tends to the grid's end).

    The examples are split into `folds` (at most one per example); each fold is rescaled by the T
    fitted on the others, and the ECE of those held-out predictions is compared with the ECE as scored.
    """
    n = len(scored.ids)
    if n < 2:
        raise ValueError("calibration needs at least 2 scored examples")
    folds = min(folds, n)
    assignment = np.random.default_rng(seed).permutation(n) % folds
    held_out = np.empty_like(scored.probabilities)
    for fold in range(folds):
        test = assignment == fold
        temperature = fit_temperature(scored.probabilities[~test], scored.gold[~test])
        held_out[test] = with_temperature(scored.probabilities[test], temperature)
    ece_before, _ = reliability(scored)
    ece_after, _ = reliability(Scored(scored.ids, scored.gold, held_out))
    fitted = fit_temperature(scored.probabilities, scored.gold)
    adopted = ece_after < ece_before and n >= MIN_CALIBRATION_EXAMPLES
    return Calibration(fitted if adopted else 1.0, fitted, ece_before, ece_after, adopted, folds)


# --- abstention and scoring --------------------------------------------------------------------------


def abstains(confidence: float, min_confidence: float | None) -> bool:
    """Whether a prediction whose best label has probability `confidence` abstains (None: never)."""
    return min_confidence is not None and confidence < min_confidence


def score_examples(
    classifier: Classifier,
    texts: Sequence[TextInput],
    labels: Sequence[str],
    ids: np.ndarray,
    *,
    leave_out: bool = False,
    progress: bool | str = False,
    embedded: Embeddings | None = None,
) -> Scored:
    """The final distribution `classifier` gives each labelled example, as it would serve it.

    `leave_out`: the examples are the store's own, under `ids`, and each is scored with itself kept out
    of its neighbours and demonstrations (leave-one-out). Without it, `ids` only name the examples in the
    result, and the store is searched whole (the examples are not in it: a held-out dev split).
    `embedded`: the texts' embeddings under the classifier as it stands (without `leave_out`), when
    already taken.
    """
    ids = np.asarray(ids, dtype=np.int64)
    gold = classifier.label_indices(labels)
    exclude = ids if leave_out else None
    if embedded is not None and leave_out:
        raise ValueError("embeddings taken with every neighbour in view cannot be scored leave-one-out")
    embeddings = (
        classifier.embed(texts, exclude_ids=exclude, progress=progress) if embedded is None else embedded
    )
    scores = classifier.score(embeddings, exclude_ids=exclude)
    p_knn = None if len(classifier.store) == 0 else scores.p_knn
    return Scored(ids, gold, scores.probabilities, scores.p_lm, p_knn)


def leave_one_out(
    classifier: Classifier,
    texts: Sequence[TextInput],
    labels: Sequence[str],
    ids: np.ndarray,
    *,
    progress: bool | str = False,
) -> Scored:
    """The store's own examples, each scored with itself kept out (`score_examples(leave_out=True)`).

    The prompt is frozen there, so its own prediction of an example was not fitted to that example.
    """
    return score_examples(classifier, texts, labels, ids, leave_out=True, progress=progress)


def describe(
    report: QualityReport,
    calibration: Calibration | None,
    temperature: float = 1.0,
    readers: Readers | None = None,
) -> dict[str, Any]:
    """The report as JSON keeps it (the service's `ReportOut` and `openbook report --json` say the same);
    `temperature` is the one the scored classifier serves with."""
    return {
        "examples": report.examples,
        "accuracy": report.accuracy,
        "macro_f1": report.macro_f1,
        "per_label": {label: asdict(scores) for label, scores in report.per_label.items()},
        "confusion": {"labels": list(report.labels), "matrix": report.confusion.tolist()},
        "ece": report.ece,
        "reliability": [asdict(b) for b in report.reliability],
        "calibration": None if calibration is None else {**asdict(calibration), "temperature": temperature},
        "coverage": [asdict(point) for point in report.coverage],
        "suspect_examples": [asdict(suspect) for suspect in report.suspects],
        "confused_pairs": [asdict(pair) for pair in report.confused_pairs],
        "readers": None if readers is None else asdict(readers),
    }


def report_of(
    raw: Scored, labels: Sequence[str], temperature: float = 1.0, readers: Readers | None = None
) -> dict[str, Any]:
    """`describe` of the report of `raw` scores (before any temperature) read at `temperature`, with the
    calibration check of `raw` (None with fewer than 2 examples) and each reader alone (`readers`)."""
    served = Scored(raw.ids, raw.gold, with_temperature(raw.probabilities, temperature))
    calibration = calibrate(raw) if len(raw.ids) >= 2 else None
    return describe(quality_report(served, labels), calibration, temperature, readers)
