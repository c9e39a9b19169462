"""The k-shot evaluation protocol for the inference-time methods.

For each seed: the store is built from `train`; every hyper-parameter (k, T,
lambda) is chosen without test: on `dev`, and for `knn-interp` under the frozen
prompt also on the training examples scored leave-one-out (`selection.py`);
accuracy and macro-F1 are reported on `test`. Dev has 16 examples per class,
so accuracy ties are common: they are broken by the gold label's log-likelihood,
a smooth criterion.

The backbone is frozen here, so each split is embedded once and every method
and grid point reuses those slot vectors and label scores. The test split is
shared by all seeds: it is embedded once per task, and its cost is split
evenly over the seeds in the reported wall time.

Neighbours are scored as the classifier's `KnnConfig` scores them (`similarity`, `standardise`,
`python -m research eval --knn-*`); the rules choose k, T and lambda, and knn-interp's lambda-only rule
sits at that config's k and T.

A dev-only run (`python -m research eval --no-test`, splits whose `test` is None) makes
the same choices and scores nothing on test: its records carry the dev
accuracy of what was chosen (`params["dev_accuracy"]`) and no test figures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from openbook.backbone import Backbone
from openbook.calibration import CalibrationMode, calibrated_p_lm
from openbook.classifier import Classifier
from openbook.data import Example, KShotSplits, example_labels, load_kshot
from openbook.knn import DEFAULT_KNN, KnnConfig, knn_search
from openbook.out_of_scope import out_of_scope_scores, threshold_within_cost
from openbook.predictions import Embeddings
from openbook.prompting import PromptError
from openbook.selection import (
    K_GRID,
    TEMPERATURE_GRID,
    Evidence,
    SelectionRule,
    Split,
    accuracy,
    lambda_rule,
    leave_one_out_evidence,
    pooled,
    select,
    split_mixture,
)
from openbook.store import KnowledgeStore
from tqdm.auto import tqdm

from research.experiments.embedding_cache import embed_once, in_book_space


@dataclass(frozen=True)
class EvalRecord:
    task: str
    method: str
    seed: int
    accuracy: float | None  # on test; None in a dev-only run
    macro_f1: float | None
    params: dict  # the choices made on dev, and dev_accuracy: the final classifier's accuracy on dev
    seconds: float

    @property
    def dev_only(self) -> bool:
        return self.accuracy is None


@dataclass(frozen=True)
class MethodInputs:
    num_labels: int
    p_lm_dev: np.ndarray  # (N_dev, C) calibrated
    p_lm_test: np.ndarray | None  # None: a dev-only run
    dev: Split
    test: Split | None
    store_size: int
    # The training examples scored leave-one-out: given only where the prompt was not fitted to them
    # (the frozen backbone); a trained classifier's inputs leave it out, and its rules read dev alone.
    train: Evidence | None = None
    knn: KnnConfig = DEFAULT_KNN  # how neighbours were scored; knn-interp's k and T


class MethodResult(NamedTuple):
    p_test: np.ndarray | None  # (N_test, C) under the settings chosen (None: a dev-only run)
    params: dict  # the settings chosen, and dev_accuracy
    p_dev: np.ndarray  # (N_dev, C) under the same settings: what a refusal threshold is chosen on


# The label index of a test query that fits none of the labels (a task's `oos_test` split): such rows
# follow the in-scope ones in the test arrays, are left out of accuracy and scored for refusal only.
OUT_OF_SCOPE = -1
# A refusal threshold may cost in-scope dev accuracy this much, refusals counted as errors (the
# many-label target: out-of-scope recall for at most 3 points of in-scope accuracy).
OUT_OF_SCOPE_MAX_COST = 0.03
INFERENCE_METHODS: dict[str, Callable[[MethodInputs], MethodResult]] = {}
KNN_ONLY_RULE = SelectionRule(ks=K_GRID, temperatures=TEMPERATURE_GRID, lambdas=(1.0,))


def inference_method(name: str) -> Callable:
    def register(fn: Callable[[MethodInputs], MethodResult]) -> Callable[[MethodInputs], MethodResult]:
        INFERENCE_METHODS[name] = fn
        return fn

    return register


def _select(inputs: MethodInputs, rule: SelectionRule, evidence: Evidence, selected_on: str) -> MethodResult:
    chosen, _ = select(evidence, rule, inputs.store_size, inputs.knn)
    p_dev = split_mixture(inputs.p_lm_dev, inputs.dev, chosen)
    p_test = None
    if inputs.p_lm_test is not None and inputs.test is not None:
        p_test = split_mixture(inputs.p_lm_test, inputs.test, chosen)
    params = {
        "k": chosen.k,
        "temperature": chosen.temperature,
        "lam": chosen.lam,
        "dev_accuracy": accuracy(p_dev.argmax(-1), inputs.dev.labels),  # of the chosen settings, on dev
        "selected_on": selected_on,
    }
    return MethodResult(p_test, params, p_dev)


@inference_method("zero-shot")
def zero_shot(inputs: MethodInputs) -> MethodResult:
    """The prompt alone: argmax of the (calibrated) label-word distribution."""
    params = {"dev_accuracy": accuracy(inputs.p_lm_dev.argmax(-1), inputs.dev.labels)}
    return MethodResult(inputs.p_lm_test, params, inputs.p_lm_dev)


@inference_method("knn")
def knn_only(inputs: MethodInputs) -> MethodResult:
    """The store alone: P_kNN over the slot vectors of the training examples."""
    return _select(inputs, KNN_ONLY_RULE, _dev_evidence(inputs), "dev")


@inference_method("knn-interp")
def knn_interp(inputs: MethodInputs) -> MethodResult:
    """RetroPrompt's kNN interpolation lam * P_kNN + (1 - lam) * P_LM; lam chosen on train (LOO) + dev.

    The training examples count only under a frozen prompt (`MethodInputs.train`); a trained
    classifier's lambda is chosen on dev alone (selection.py, docs/knn-selection.md).
    """
    dev, rule = _dev_evidence(inputs), lambda_rule(inputs.knn)
    if inputs.train is None:
        return _select(inputs, rule, dev, "dev")
    return _select(inputs, rule, pooled([inputs.train, dev]), "train (leave-one-out) + dev")


@inference_method("knn-interp-dev")
def knn_interp_dev(inputs: MethodInputs) -> MethodResult:
    """knn-interp with lam chosen on dev alone: the rule before the training examples were pooled in."""
    return _select(inputs, lambda_rule(inputs.knn), _dev_evidence(inputs), "dev")


def book_at_knn(inputs: MethodInputs) -> MethodResult:
    """P_kNN alone at the inputs' own k and T (what knn-interp mixes in), not chosen on anything."""
    rule = dataclasses.replace(lambda_rule(inputs.knn), lambdas=(1.0,))
    return _select(inputs, rule, _dev_evidence(inputs), "none: the inputs' k and T")


def _dev_evidence(inputs: MethodInputs) -> Evidence:
    return Evidence(inputs.p_lm_dev, inputs.dev)


def method_inputs(
    store: KnowledgeStore,
    bias: np.ndarray | None,
    dev: Embeddings,
    dev_labels: np.ndarray,
    test: Embeddings | None,  # None: a dev-only run
    test_labels: np.ndarray | None,
    *,
    frozen_train: tuple[np.ndarray, Embeddings, np.ndarray] | None = None,
    knn: KnnConfig = DEFAULT_KNN,
) -> MethodInputs:
    """Calibrated P_LM and the store's neighbours for dev and test: all an inference method reads.

    `frozen_train` is (store ids, embeddings, labels) of the store's training examples, for a prompt
    that was not trained on them: they then count as evidence too, each scored leave-one-out.
    Neighbours are found and scored with `knn.similarity`.
    """
    k_max = min(max(K_GRID), len(store))
    p_lm_test, test_split = None, None
    if test is not None and test_labels is not None:
        p_lm_test = calibrated_p_lm(test.lm_log_probs, bias)
        test_split = Split(test_labels, knn_search(store, test.vectors, k_max, knn.similarity))
    train = None
    if frozen_train is not None:
        ids, embedded, labels = frozen_train
        p_lm_train = calibrated_p_lm(embedded.lm_log_probs, bias)
        train = leave_one_out_evidence(
            store, ids, embedded.vectors, p_lm_train, labels, k_max, knn.similarity
        )
    return MethodInputs(
        num_labels=dev.lm_log_probs.shape[1],
        p_lm_dev=calibrated_p_lm(dev.lm_log_probs, bias),
        p_lm_test=p_lm_test,
        dev=Split(dev_labels, knn_search(store, dev.vectors, k_max, knn.similarity)),
        test=test_split,
        store_size=len(store),
        train=train,
        knn=knn,
    )


def scores_on_test(
    p_test: np.ndarray | None, test_labels: np.ndarray | None, num_labels: int
) -> tuple[float | None, float | None]:
    """Accuracy and macro-F1 on the in-scope test queries, or (None, None) in a dev-only run."""
    if p_test is None or test_labels is None:
        return None, None
    inside = test_labels != OUT_OF_SCOPE
    predicted = p_test[inside].argmax(-1)
    return accuracy(predicted, test_labels[inside]), macro_f1(predicted, test_labels[inside], num_labels)


def out_of_scope_on_test(
    result: MethodResult, dev_labels: np.ndarray, test_labels: np.ndarray | None
) -> dict:
    """Nothing for a test split without out-of-scope queries. Else the refusal threshold chosen on the
    in-scope dev examples alone (`out_of_scope.py`: the highest whose dev accuracy, refusals counted as
    errors, is within OUT_OF_SCOPE_MAX_COST of answering all) and how it does on test."""
    if result.p_test is None or test_labels is None or not (test_labels == OUT_OF_SCOPE).any():
        return {}
    confidence = {"dev": result.p_dev.max(-1), "test": result.p_test.max(-1)}
    return {"out_of_scope": _refusal(result, confidence, dev_labels, test_labels)}


def _refusal(
    result: MethodResult, score: dict[str, np.ndarray], dev_labels: np.ndarray, test_labels: np.ndarray
) -> dict:
    """Refusing the queries whose `score` (dev's and test's, higher: surer) is below the threshold chosen
    on the in-scope dev examples, as `out_of_scope_on_test` says, and how that does on test."""
    assert result.p_test is not None
    threshold = threshold_within_cost(
        score["dev"], result.p_dev.argmax(-1) == dev_labels, OUT_OF_SCOPE_MAX_COST
    )
    inside = test_labels != OUT_OF_SCOPE
    test, correct = score["test"], result.p_test.argmax(-1) == test_labels
    scores = out_of_scope_scores(test[inside], correct[inside], test[~inside], threshold)
    return {**dataclasses.asdict(scores), "max_cost": OUT_OF_SCOPE_MAX_COST}


# What a refusal may read (docs/experiments/two-readers.md, "Refusing out-of-scope queries by the
# reader's neighbours"): the prediction's largest probability, or the query's similarity to its nearest
# stored example, or its mean similarity to its k nearest (k as the prediction reads them).
REFUSAL_SCORES = ("confidence", "nearest", "neighbours")


def refusals_on_test(
    result: MethodResult, inputs: MethodInputs, dev_labels: np.ndarray, test_labels: np.ndarray | None
) -> dict:
    """`out_of_scope_on_test` under each of REFUSAL_SCORES, the neighbours read in `inputs`' book (the
    reader's, in a run with one); nothing for a test split without out-of-scope queries."""
    if result.p_test is None or test_labels is None or not (test_labels == OUT_OF_SCOPE).any():
        return {}
    assert inputs.dev.hits is not None and inputs.test is not None and inputs.test.hits is not None
    k = int(result.params.get("k", inputs.knn.k))
    similarities = {"dev": inputs.dev.hits.similarities, "test": inputs.test.hits.similarities}
    scores = {
        "confidence": {"dev": result.p_dev.max(-1), "test": result.p_test.max(-1)},
        "nearest": {split: s[:, 0] for split, s in similarities.items()},
        "neighbours": {split: s[:, :k].mean(-1) for split, s in similarities.items()},
    }
    return {
        "refusals": {name: _refusal(result, scores[name], dev_labels, test_labels) for name in REFUSAL_SCORES}
    }


def scored_queries(classifier: Classifier, splits: KShotSplits) -> tuple[list[Example], np.ndarray] | None:
    """The test queries, in-scope then out-of-scope, and their label indices (OUT_OF_SCOPE for the
    latter); None in a dev-only run."""
    if splits.test is None:
        return None
    labels = [example_labels(classifier, splits.test), np.full(len(splits.out_of_scope), OUT_OF_SCOPE)]
    return [*splits.test, *splits.out_of_scope], np.concatenate(labels).astype(np.int64)


def params_on_test(test: Embeddings | None, test_labels: np.ndarray | None = None) -> dict:
    """What a record says of the test examples it was scored on (nothing in a dev-only run)."""
    if test is None:
        return {}
    labels = np.zeros(len(test.truncated)) if test_labels is None else test_labels
    return query_counts(labels) | {"truncated_test": int(test.truncated.sum())}


def ran_on(backbone: Backbone) -> dict[str, str]:
    """Where a record's forwards ran: the device type and the weights' dtype (bfloat16 on CUDA by default,
    float32 on a CPU), which a grid run across machines would otherwise not tell apart."""
    return {"device": backbone.device.type, "dtype": str(backbone.dtype).removeprefix("torch.")}


def query_counts(test_labels: np.ndarray | None) -> dict[str, int]:
    """How many in-scope test queries a record was scored on, and out-of-scope ones where there are."""
    if test_labels is None:
        return {}
    refused = int((test_labels == OUT_OF_SCOPE).sum())
    counts = {"test_examples": len(test_labels) - refused}
    return counts | ({"out_of_scope_examples": refused} if refused else {})


def _untrained_inputs(
    train: Embeddings,
    dev: Embeddings,
    test: Embeddings | None,
    labels: tuple[np.ndarray, np.ndarray, np.ndarray | None],  # train, dev, test
    bias: np.ndarray | None,
    knn: KnnConfig,
) -> MethodInputs:
    """An untrained classifier's inputs: a store of the training examples, which count as evidence too."""
    train_labels, dev_labels, test_labels = labels
    train_ids = np.arange(len(train_labels))
    store = KnowledgeStore(train.vectors.shape[1])
    store.add(train_ids, train.vectors, train_labels)
    return method_inputs(
        store,
        bias,
        dev,
        dev_labels,
        test,
        test_labels,
        frozen_train=(train_ids, train, train_labels),
        knn=knn,
    )


def _slot_reading(method: str, inputs: MethodInputs, test_labels: np.ndarray | None) -> dict[str, object]:
    """`method` read with the slot vectors' store (a reader's run keeps it beside its own): its choice and
    its test accuracy."""
    result = INFERENCE_METHODS[method](inputs)
    accuracy, _ = scores_on_test(result.p_test, test_labels, inputs.num_labels)
    return {**result.params, "accuracy": accuracy}


def macro_f1(predicted: np.ndarray, gold: np.ndarray, num_labels: int) -> float:
    scores = []
    for label in range(num_labels):
        tp = np.sum((predicted == label) & (gold == label))
        fp = np.sum((predicted == label) & (gold != label))
        fn = np.sum((predicted != label) & (gold == label))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def evaluate_task(
    classifier: Classifier,
    data_dir: str | Path,
    task: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    *,
    calibration: CalibrationMode = "domain",
    shots: int = 16,
    progress: bool = True,
    load: Callable[[int], KShotSplits] | None = None,  # seed -> splits; default: the k-shot layout
    on_record: Callable[[EvalRecord], None] = lambda record: None,  # each record as soon as it is made
    cache_dir: Path | None = None,  # where the test queries' embeddings are kept between runs (see below)
) -> list[EvalRecord]:
    unknown = [m for m in methods if m not in INFERENCE_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; available: {sorted(INFERENCE_METHODS)}")
    load = load or (lambda seed: load_kshot(data_dir, task, seed, shots))
    splits = {seed: load(seed) for seed in seeds}  # all data checked up front
    labels = {
        seed: [example_labels(classifier, getattr(s, part)) for part in ("train", "dev")]
        for seed, s in splits.items()
    }
    test_part = scored_queries(classifier, splits[seeds[0]])  # None: a dev-only run
    queries, test_labels = (None, None) if test_part is None else test_part
    seen = [a for pair in labels.values() for a in pair]
    seen += [] if test_labels is None else [test_labels[test_labels != OUT_OF_SCOPE]]
    if len(np.unique(np.concatenate(seen))) < 2:
        raise PromptError(f"{task}: the data has fewer than 2 classes")

    started = time.perf_counter()
    test_raw = None  # the test queries' embeddings; their kNN queries in the book's space below
    if queries is not None:
        test_raw = embed_once(
            classifier, [e.text for e in queries], cache_dir, progress=f"{task} test" if progress else False
        )
    test_embeddings = None if test_raw is None else in_book_space(classifier, test_raw)
    test_seconds_per_seed = (time.perf_counter() - started) / len(seeds)
    records = []
    for seed in tqdm(seeds, desc=f"{task} seeds", disable=not progress):
        started = time.perf_counter()
        train_labels, dev_labels = labels[seed]
        train_raw, dev_raw = (
            embed_once(
                classifier,
                [e.text for e in getattr(splits[seed], part)],
                cache_dir,
                progress=f"{task} {part} (seed {seed})" if progress else False,
            )
            for part in ("train", "dev")
        )
        bias = classifier.calibration_bias(calibration, domain_lm_log_probs=train_raw.lm_log_probs)
        labelled = (train_labels, dev_labels, test_labels)
        book = (in_book_space(classifier, train_raw), in_book_space(classifier, dev_raw), test_embeddings)
        inputs = _untrained_inputs(*book, labelled, bias, classifier.knn)
        # with a reader, each method read with the slot store too: the same prompt, the book it had
        slot_inputs = None
        if classifier.reader is not None:
            slot_inputs = _untrained_inputs(train_raw, dev_raw, test_raw, labelled, bias, classifier.knn)
        shared_seconds = time.perf_counter() - started + test_seconds_per_seed
        for method in methods:
            method_started = time.perf_counter()
            result = INFERENCE_METHODS[method](inputs)
            test_accuracy, test_macro_f1 = scores_on_test(result.p_test, test_labels, len(classifier.labels))
            record = EvalRecord(
                task=task,
                method=method,
                seed=seed,
                accuracy=test_accuracy,
                macro_f1=test_macro_f1,
                params={
                    **result.params,
                    "calibration": calibration,
                    **ran_on(classifier.backbone),
                    **params_on_test(test_embeddings, test_labels),
                    **out_of_scope_on_test(result, dev_labels, test_labels),
                    **(
                        {}
                        if slot_inputs is None
                        else {"slot": _slot_reading(method, slot_inputs, test_labels)}
                    ),
                },
                seconds=round(shared_seconds + time.perf_counter() - method_started, 3),
            )
            records.append(record)
            on_record(record)
    return records
