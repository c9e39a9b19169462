"""`python -m research knn-selection`: how well each rule for choosing (k, T, lambda) does on dev it did
not see.

Dev has 16 examples per class, so a rule that picks its settings on dev cannot be judged on the
same dev. The nested check splits each seed's dev set into two stratified halves, lets a rule choose
on one half (plus, for the rules that use them, the training examples scored leave-one-out) and
scores that choice on the other half; both ways round, over `splits` random half-splits per seed. The
store holds the seed's training split, as in `python -m research eval`. Only train and dev files are read.

Each seed's splits are embedded once and cached (`embed_seed`), so a rule costs no forward pass.
With a trained method, the method is first trained on the seed's train split (its checkpoint chosen
on the whole dev set, as `openbook train` does) and the check reads what the trained classifier gives:
its P_LM on its own training examples is then fitted to them, which is what a rule for trained
classifiers must survive.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from openbook.atomic import staged_file
from openbook.calibration import CalibrationMode, calibrated_p_lm
from openbook.classifier import Classifier
from openbook.data import Example, example_labels
from openbook.knn import KnnConfig, knn_search
from openbook.methods import Method
from openbook.selection import (
    JOINT_RULE,
    K_GRID,
    Evidence,
    SelectionRule,
    Split,
    accuracy,
    leave_one_out_evidence,
    pooled,
    select,
    split_mixture,
)
from openbook.store import KnowledgeStore
from openbook.train_config import TrainConfig
from openbook.training import train

EvidenceKind = Literal["dev", "train", "train+dev"]
# How neighbours are scored here: by plain cosine, as in the check's published tables (docs/knn-selection.md),
# whatever KnnConfig's default is now.
SCORING = KnnConfig(similarity="cosine", standardise=False)


@dataclass(frozen=True)
class CheckedRule:
    name: str
    rule: SelectionRule
    evidence: EvidenceKind  # train: the training examples, each scored leave-one-out


def _lambda_rules(evidence: EvidenceKind, label: str) -> list[CheckedRule]:
    return [
        CheckedRule(f"λ, {label}, accuracy", SelectionRule(), evidence),
        CheckedRule(f"λ, {label}, log-likelihood", SelectionRule(criterion="log-likelihood"), evidence),
    ]


def _grid_rules(evidence: EvidenceKind, label: str) -> list[CheckedRule]:
    k_lambda = SelectionRule(ks=K_GRID)
    return [
        CheckedRule(f"{name}, {label}, {criterion}", dataclasses.replace(rule, criterion=criterion), evidence)
        for name, rule in (("(k, λ)", k_lambda), ("(k, T, λ)", JOINT_RULE))
        for criterion in ("accuracy", "log-likelihood")
    ]


BASELINE = "λ, dev, accuracy"  # the rule before this check: lambda alone, on dev alone
RULES: tuple[CheckedRule, ...] = (
    CheckedRule("zero-shot (λ = 0)", SelectionRule(lambdas=(0.0,)), "dev"),
    CheckedRule("kNN alone (λ = 1, k = 16, T = 0.1)", SelectionRule(lambdas=(1.0,)), "dev"),
    *_lambda_rules("dev", "dev"),
    *_grid_rules("dev", "dev"),
    *_lambda_rules("train", "train LOO"),
    *_lambda_rules("train+dev", "train LOO + dev"),
    *_grid_rules("train+dev", "train LOO + dev"),
)


@dataclass(frozen=True)
class SeedEmbeddings:
    """What the check reads of one seed: slot vectors and label scores of train and dev, and the prior."""

    train_vectors: np.ndarray  # (N_train, H) unit rows, the store's keys
    train_lm_log_probs: np.ndarray  # (N_train, C); with demonstrations, retrieved leave-one-out
    train_labels: np.ndarray  # (N_train,)
    dev_vectors: np.ndarray  # (N_dev, H)
    dev_lm_log_probs: np.ndarray  # (N_dev, C)
    dev_labels: np.ndarray  # (N_dev,)
    label_bias: np.ndarray  # (C,) the log-prior the classifier subtracts; zeros: none

    def save(self, path: Path) -> None:
        with staged_file(path) as staging, staging.open("wb") as file:
            np.savez(file, **dataclasses.asdict(self))

    @classmethod
    def load(cls, path: Path) -> SeedEmbeddings:
        with np.load(path) as arrays:
            return cls(**{field.name: arrays[field.name] for field in dataclasses.fields(cls)})


@dataclass(frozen=True)
class SeedEvidence:
    train: Evidence  # each training example's neighbours from the other training examples
    dev: Evidence  # each dev example's neighbours from the training examples
    store_size: int

    def for_rule(self, evidence: EvidenceKind, dev_rows: np.ndarray) -> Evidence:
        """What a rule sees when it may read the dev examples at `dev_rows`."""
        if evidence == "train":
            return self.train
        dev = self.dev.rows(dev_rows)
        return dev if evidence == "dev" else pooled([self.train, dev])


def seed_evidence(embeddings: SeedEmbeddings) -> SeedEvidence:
    """The store of the training split, and both splits scored against it (train leave-one-out)."""
    ids = np.arange(len(embeddings.train_labels), dtype=np.int64)
    store = KnowledgeStore(embeddings.train_vectors.shape[1])
    store.add(ids, embeddings.train_vectors, embeddings.train_labels)
    k = min(max(K_GRID), len(store))
    p_lm = {
        part: calibrated_p_lm(getattr(embeddings, f"{part}_lm_log_probs"), embeddings.label_bias)
        for part in ("train", "dev")
    }
    dev_hits = knn_search(store, embeddings.dev_vectors, k, SCORING.similarity)
    return SeedEvidence(
        train=leave_one_out_evidence(
            store,
            ids,
            embeddings.train_vectors,
            p_lm["train"],
            embeddings.train_labels,
            k,
            SCORING.similarity,
        ),
        dev=Evidence(p_lm["dev"], Split(embeddings.dev_labels, dev_hits)),
        store_size=len(store),
    )


def stratified_halves(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint sets of positions, each holding half of every label's examples (an odd one: the first)."""
    first, second = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        half = (len(members) + 1) // 2
        first.append(members[:half])
        second.append(members[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


@dataclass(frozen=True)
class RuleOutcome:
    held_out_accuracy: float  # mean over half-splits and both directions
    mean_lambda: float  # of the settings the rule chose
    chosen: list[tuple[int, float, float]]  # (k, T, lambda) per half-split and direction


def nested_check(
    evidence: SeedEvidence, rules: Sequence[CheckedRule], splits: int, seed: int
) -> dict[str, RuleOutcome]:
    """Each rule's held-out dev accuracy on `splits` stratified half-splits of dev, both ways round."""
    scores: dict[str, list[float]] = {rule.name: [] for rule in rules}
    chosen: dict[str, list[tuple[int, float, float]]] = {rule.name: [] for rule in rules}
    for split in range(splits):
        halves = stratified_halves(evidence.dev.split.labels, np.random.default_rng([seed, split]))
        for seen, held_out in (halves, halves[::-1]):
            scored = evidence.dev.rows(held_out)
            for rule in rules:
                seen_evidence = evidence.for_rule(rule.evidence, seen)
                config, _ = select(seen_evidence, rule.rule, evidence.store_size, SCORING)
                p = split_mixture(scored.p_lm, scored.split, config)
                scores[rule.name].append(accuracy(p.argmax(-1), scored.split.labels))
                assert config.lam is not None  # a rule chooses a number
                chosen[rule.name].append((config.k, config.temperature, config.lam))
    return {
        name: RuleOutcome(
            float(np.mean(scores[name])), float(np.mean([lam for _, _, lam in chosen[name]])), chosen[name]
        )
        for name in scores
    }


@dataclass(frozen=True)
class TrainedSetup:
    """Train this method before embedding (see the module's docstring); `config.seed` is the training seed."""

    method: Method
    config: TrainConfig


def embed_seed(
    classifier: Classifier,
    train_split: list[Example],
    dev_split: list[Example],
    *,
    calibration: CalibrationMode = "domain",
    trained: TrainedSetup | None = None,
) -> SeedEmbeddings:
    """Embed one seed's train and dev under the frozen prompt, or under `trained`'s classifier."""
    train_texts, dev_texts = [e.text for e in train_split], [e.text for e in dev_split]
    train_labels, dev_labels = example_labels(classifier, train_split), example_labels(classifier, dev_split)
    if trained is None:
        train_embedded = classifier.embed(train_texts)
        bias = classifier.calibration_bias(calibration, domain_lm_log_probs=train_embedded.lm_log_probs)
        dev_embedded = classifier.embed(dev_texts)
    else:
        fitted = trained.method.prepare(
            dataclasses.replace(classifier, store=classifier.empty_store(), label_bias=None, prompt=None)
        )
        train(
            fitted,
            trained.method,
            train_texts,
            train_labels,
            dev_texts,
            dev_labels,
            trained.config,
            progress=False,
        )
        # the store holds train under ids 0..N-1: a training example's demonstrations leave it out
        train_embedded = fitted.embed(train_texts, exclude_ids=np.arange(len(train_texts)))
        dev_embedded = fitted.embed(dev_texts)
        bias = fitted.label_bias
    return SeedEmbeddings(
        train_vectors=train_embedded.vectors,
        train_lm_log_probs=train_embedded.lm_log_probs,
        train_labels=train_labels,
        dev_vectors=dev_embedded.vectors,
        dev_lm_log_probs=dev_embedded.lm_log_probs,
        dev_labels=dev_labels,
        label_bias=np.zeros(len(classifier.labels), np.float32) if bias is None else np.asarray(bias),
    )


@dataclass(frozen=True)
class CheckRecord:
    task: str
    seed: int
    rule: str
    held_out_accuracy: float
    mean_lambda: float
    chosen: list[tuple[int, float, float]]


def run_check(
    tasks: Sequence[str],
    seeds: Sequence[int],
    embeddings_of: Callable[[str, int], SeedEmbeddings],  # (task, seed) -> embeddings, cached by the caller
    *,
    splits: int,
    rules: Sequence[CheckedRule] = RULES,
) -> list[CheckRecord]:
    records = []
    for task in tasks:
        for seed in seeds:
            outcomes = nested_check(seed_evidence(embeddings_of(task, seed)), rules, splits, seed)
            records += [
                CheckRecord(task, seed, name, o.held_out_accuracy, o.mean_lambda, o.chosen)
                for name, o in outcomes.items()
            ]
    return records


def cached_embeddings(path: Path, embed: Callable[[], SeedEmbeddings]) -> SeedEmbeddings:
    """The embeddings saved at `path`, or `embed()`'s, saved there first."""
    if path.exists():
        return SeedEmbeddings.load(path)
    embeddings = embed()
    embeddings.save(path)
    return embeddings


def check_table(records: Sequence[CheckRecord], baseline: str = BASELINE) -> str:
    """Markdown: held-out dev accuracy in % per rule (rows) and task, means over seeds; the mean λ chosen;
    and the paired difference from `baseline` over task x seed, mean (standard error), with wins / losses.
    """
    tasks = list(dict.fromkeys(r.task for r in records))
    rules = list(dict.fromkeys(r.rule for r in records))
    reference = {(r.task, r.seed): r.held_out_accuracy for r in records if r.rule == baseline}
    lines = [
        "| selection rule | "
        + " | ".join(tasks)
        + f" | mean | mean λ chosen | vs {baseline} | wins / losses |",
        "|---" * (len(tasks) + 5) + "|",
    ]
    for rule in rules:
        mine = [r for r in records if r.rule == rule]
        per_task = [100 * np.mean([r.held_out_accuracy for r in mine if r.task == task]) for task in tasks]
        lam = np.mean([r.mean_lambda for r in mine])
        cells = " | ".join(f"{value:.1f}" for value in per_task)
        gains = np.array([100 * (r.held_out_accuracy - reference[r.task, r.seed]) for r in mine if reference])
        paired, tally = "", ""
        if len(gains) > 1:
            paired = f"{gains.mean():+.1f} ({gains.std(ddof=1) / np.sqrt(len(gains)):.1f})"
            tally = f"{int((gains > 0).sum())} / {int((gains < 0).sum())}"
        lines.append(f"| {rule} | {cells} | {np.mean(per_task):.1f} | {lam:.2f} | {paired} | {tally} |")
    return "\n".join(lines) + "\n"


def write_records(records: Sequence[CheckRecord], out: Path) -> None:
    with staged_file(out / "results.json") as staging:
        staging.write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")
