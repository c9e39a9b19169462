"""Choosing kNN interpolation's k, T and lambda on held-out examples.

A rule (`SelectionRule`) is a grid of (k, T, lambda) and a criterion that ranks its points on
*evidence*: labelled examples whose P_LM and neighbours were computed without their own label.

- Dev examples are evidence: the store holds the training examples, and no weight was fitted to
  dev's labels (a trained classifier's checkpoint is chosen on dev, the same for every lambda).
- Training examples are evidence only where nothing was fitted to them: under a frozen prompt
  (`knn-interp` in the evaluation), each one scored with its neighbours drawn from the *other*
  training examples (leave-one-out). A trained classifier's P_LM was fitted to its own training
  examples (retroprompt on SST-2: P(gold) 0.97 on train, 0.82 on dev), and its slot vectors were
  trained to cluster them by label, so pooling them would pull lambda towards whichever side looks
  best on them; for a trained classifier (`fitting.py`: `openbook train`, the service's worker) dev
  alone is the evidence.
- An untrained task in the service has no dev split: its stored examples, each scored leave-one-out,
  are all the evidence there is (`lambda_on_store`; chosen over a fixed 0.5 by the lab's first-use
  check, docs/experiments/untrained-task-calibration.md).

The rule (`DEFAULT_RULE`: lambda alone, k = 16, T = 0.1, by accuracy with ties broken by the gold
log-likelihood) and the evidence each caller gives were fixed by a nested check on dev alone
(`python -m research knn-selection`, docs/knn-selection.md).

A rule chooses k, T and lambda; how neighbours are scored (`KnnConfig.similarity`, `.standardise`)
is the caller's, given as the `base` config whose other fields the chosen one keeps.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch

from openbook.calibration import calibrated_p_lm
from openbook.knn import (
    DEFAULT_KNN,
    KnnConfig,
    Similarity,
    interpolate,
    knn_distribution,
    knn_mixture,
    knn_search,
)
from openbook.store import KnowledgeStore, SearchResult

K_GRID = (1, 2, 4, 8, 16, 32)
TEMPERATURE_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)
LAMBDA_GRID = tuple(round(0.1 * i, 1) for i in range(11))

Criterion = Literal["accuracy", "log-likelihood"]
CRITERIA: tuple[Criterion, ...] = ("accuracy", "log-likelihood")


@dataclass(frozen=True)
class SelectionRule:
    """The (k, T, lambda) grid a rule searches and what ranks its points on the evidence.

    `accuracy` breaks its (common) ties by the mean gold log-likelihood; `log-likelihood` ranks by
    that smooth score alone. The defaults are the rule that ships: lambda alone, at KnnConfig's k and T.
    """

    ks: tuple[int, ...] = (KnnConfig().k,)
    temperatures: tuple[float, ...] = (KnnConfig().temperature,)
    lambdas: tuple[float, ...] = LAMBDA_GRID
    criterion: Criterion = "accuracy"

    def __post_init__(self) -> None:
        if not (self.ks and self.temperatures and self.lambdas):
            raise ValueError("a selection rule needs at least one k, temperature and lambda")
        for k, temperature, lam in itertools.product(self.ks, self.temperatures, self.lambdas):
            KnnConfig(k, temperature, lam)  # validates
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {self.criterion!r}")

    def grid(self, store_size: int) -> list[tuple[int, float, float]]:
        """Every (k, T, lambda), with k cut to the store's size (points that then coincide, once)."""
        points = itertools.product(self.ks, self.temperatures, self.lambdas)
        return list(dict.fromkeys((min(k, store_size), t, lam) for k, t, lam in points))


DEFAULT_RULE = SelectionRule()
# k, T and lambda jointly (330 points): the rule before the first nested check, which it lost.
JOINT_RULE = SelectionRule(ks=K_GRID, temperatures=TEMPERATURE_GRID)


def lambda_rule(base: KnnConfig) -> SelectionRule:
    """The default rule (lambda alone) at `base`'s k and T."""
    return dataclasses.replace(DEFAULT_RULE, ks=(base.k,), temperatures=(base.temperature,))


@dataclass(frozen=True)
class Split:
    labels: np.ndarray  # (N,) label indices
    hits: SearchResult | None = None  # neighbours in the train store (for train: leave-one-out)


@dataclass(frozen=True)
class Evidence:
    """Labelled examples scored without their own label: calibrated P_LM and neighbours in the store."""

    p_lm: np.ndarray  # (N, C)
    split: Split

    def __post_init__(self) -> None:
        if self.split.hits is None or len(self.p_lm) != len(self.split.labels):
            raise ValueError("evidence needs one P_LM row and one row of neighbours per label")

    def __len__(self) -> int:
        return len(self.split.labels)

    def rows(self, index: np.ndarray) -> Evidence:
        """The examples at `index` (positions or a boolean mask)."""
        hits = self.split.hits
        assert hits is not None
        picked = SearchResult(hits.ids[index], hits.labels[index], hits.similarities[index])
        return Evidence(self.p_lm[index], Split(self.split.labels[index], picked))


def pooled(parts: Sequence[Evidence]) -> Evidence:
    """One body of evidence from several (train leave-one-out and dev), every example weighing the same."""
    width = min(part.split.hits.ids.shape[1] for part in parts if part.split.hits is not None)

    def stacked(field: str) -> np.ndarray:
        return np.concatenate([getattr(part.split.hits, field)[:, :width] for part in parts])

    return Evidence(
        np.concatenate([part.p_lm for part in parts]),
        Split(
            np.concatenate([part.split.labels for part in parts]),
            SearchResult(stacked("ids"), stacked("labels"), stacked("similarities")),
        ),
    )


def leave_one_out_evidence(
    store: KnowledgeStore,
    ids: np.ndarray,
    vectors: np.ndarray,
    p_lm: np.ndarray,
    labels: np.ndarray,
    k: int,
    similarity: Similarity,
) -> Evidence:
    """The store's own examples as evidence, each with its neighbours among the *other* stored examples.

    `ids` are the examples' ids in the store, `vectors` their keys. Sound only where the prompt was not
    fitted to these examples (a frozen backbone): see the module's docstring.
    """
    return Evidence(p_lm, Split(labels, knn_search(store, vectors, k, similarity, exclude_ids=ids)))


def accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    return float((predicted == gold).mean())


def gold_log_likelihood(probabilities: np.ndarray, gold: np.ndarray) -> float:
    """Mean log P(gold); a zero probability counts as 1e-12, so one confident miss costs a bounded amount."""
    chosen = probabilities[np.arange(len(gold)), gold]
    return float(np.log(np.maximum(chosen, 1e-12)).mean())


def select(
    evidence: Evidence, rule: SelectionRule, store_size: int, base: KnnConfig = DEFAULT_KNN
) -> tuple[KnnConfig, float]:
    """The rule's best grid point on the evidence (scored as `base` scores), with its accuracy there."""
    return select_on_dev(
        evidence.p_lm, evidence.split, rule.grid(store_size), store_size, rule.criterion, base
    )


def select_on_dev(
    p_lm_dev: np.ndarray,
    dev: Split,
    grid: Sequence[tuple[int, float, float]],
    store_size: int,
    criterion: Criterion = "accuracy",
    base: KnnConfig = DEFAULT_KNN,
) -> tuple[KnnConfig, float]:
    """Best (k, T, lambda) on `dev` by `criterion`, the first of equals; with its accuracy there.

    `dev`'s neighbours were found with `base.similarity`; the chosen config is `base` at that point.
    Points with k > store_size are skipped. P_kNN is computed once per run of points sharing (k, T).
    """
    assert dev.hits is not None
    best_key, best, best_accuracy = None, None, 0.0
    p_lm = torch.from_numpy(p_lm_dev)
    for (k, temperature), points in itertools.groupby(grid, key=lambda point: point[:2]):
        if k > store_size:
            continue
        p_knn = knn_distribution(
            torch.from_numpy(dev.hits.similarities[:, :k]),
            torch.from_numpy(dev.hits.labels[:, :k]),
            p_lm.shape[1],
            temperature,
            base.standardise,
        )
        for _, _, lam in points:
            p_dev = interpolate(p_knn, p_lm, lam).numpy()
            scores = accuracy(p_dev.argmax(-1), dev.labels), gold_log_likelihood(p_dev, dev.labels)
            key = scores if criterion == "accuracy" else scores[::-1]
            if best_key is None or key > best_key:
                best = dataclasses.replace(base, k=k, temperature=temperature, lam=lam)
                best_key, best_accuracy = key, scores[0]
    assert best is not None
    return best, best_accuracy


def split_mixture(p_lm: np.ndarray, split: Split, config: KnnConfig) -> np.ndarray:
    assert split.hits is not None
    return knn_mixture(p_lm, split.hits.similarities, split.hits.labels, config)[1]


# Most stored examples `lambda_on_store` scores: an even spread of ids beyond it (a store that large
# has usually been trained on, and then lambda is chosen on dev).
STORE_EVIDENCE_LIMIT = 4096


class StoreReader(Protocol):
    """What choosing lambda on the stored examples reads of a classifier (`classifier.Classifier` is one):
    declared here so that the classifier, which keeps its lambda chosen this way (`lambda_on_store.py`),
    and this module are not read through each other."""

    knn: KnnConfig
    store: KnowledgeStore
    label_bias: np.ndarray | None

    def knn_book(self) -> KnowledgeStore:
        """The keys P_kNN reads: the store, or its examples keyed by a sentence reader."""
        ...


def lambda_on_store(classifier: StoreReader, ids: np.ndarray, lm_log_probs: np.ndarray) -> KnnConfig:
    """`classifier.knn` with lambda chosen on stored examples, each scored leave-one-out: an untrained
    classifier's only evidence. `ids` are stored examples and `lm_log_probs` their (N, C) label scores
    under the classifier's prompt.

    A store of n examples gives each one n - 1 neighbours, as many as a query sees when k >= n, so the
    rule runs at k = min(k, n - 1); the config returned keeps the classifier's k. A store that holds
    fewer than two labels gets lambda 0: its P_kNN names the same label whatever the query, and
    leave-one-out would find it always right.
    """
    base = classifier.knn
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) < 2 or len(np.unique(classifier.store.labels_of(ids))) < 2:
        return dataclasses.replace(base, lam=0.0)
    if len(ids) > STORE_EVIDENCE_LIMIT:
        spread = np.linspace(0, len(ids) - 1, STORE_EVIDENCE_LIMIT).round().astype(np.int64)
        ids, lm_log_probs = ids[spread], lm_log_probs[spread]
    k = min(base.k, len(classifier.store) - 1)
    p_lm = calibrated_p_lm(lm_log_probs, classifier.label_bias)
    book = classifier.knn_book()
    vectors = book.vectors_of(ids)
    labels = book.labels_of(ids)
    evidence = leave_one_out_evidence(book, ids, vectors, p_lm, labels, k, base.similarity)
    chosen, _ = select(evidence, lambda_rule(dataclasses.replace(base, k=k)), len(classifier.store), base)
    return dataclasses.replace(base, lam=chosen.lam)
