"""The two readers' dev probes (docs/experiments/two-readers.md): what the untrained cloze prompt and the
sentence encoder, frozen or tuned per task (`openbook.sentence_reader`), each read on dev, and how a mix
of the two reads. Test is never read.

A run is (task, seed, n per class, tuning variant): the first n examples of each class of the seed's
training split in a seeded order (`class_prefix`) tune the encoder's top layers and form its book; every
dev example is then read by
- the untrained prompt (gemma3-270m by default, content-free calibrated: what a fresh task serves): P_LM;
- the frozen encoder's and the tuned encoder's kNN over the book (cosine, k = 16, T = 0.05);
- a logistic regression on the tuned embeddings of the book (SetFit's head).
A run's record keeps each reader's dev distribution (rounded to 4 decimals), so any mixing rule is read
from the records alone (`reader_rules.py`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

KNN_K = 16
KNN_TEMPERATURE = 0.05


# An SVD variant's run reads these lower ranks too, from the same tuning (`{name}r{rank}`: probe 7).
SVD_ALSO_RANKS = (8,)


@dataclass(frozen=True)
class Variant:
    """A tuning of the encoder's top layers: `top_layers` layers (or adapters of rank `adapters` over
    them, made as `adapters_from` says), `steps` AdamW steps at `lr`, in `precision` (ReaderConfig's)."""

    name: str
    top_layers: int
    steps: int = 60
    lr: float = 1e-4
    precision: str = "float32"
    adapters: int = 0
    adapters_from: str = "lora"

    @classmethod
    def parse(cls, spec: str) -> Variant:
        """`name:top_layers[:steps[:lr[:precision[:adapters[:adapters_from]]]]]`, e.g. `t2:2:60:1e-4`,
        `t4b:4:60:1e-4:bfloat16`, `a12:12:60:5e-4:bfloat16:8` (rank-8 LoRA over all 12 layers) or
        `s12:12:60:2e-5:bfloat16:32:svd` (all 12 tuned in full, kept as their change at rank 32)."""
        name, top, *rest = spec.split(":")
        steps = int(rest[0]) if rest else 60
        lr = float(rest[1]) if len(rest) > 1 else 1e-4
        precision = rest[2] if len(rest) > 2 else "float32"
        adapters = int(rest[3]) if len(rest) > 3 else 0
        adapters_from = rest[4] if len(rest) > 4 else "lora"
        return cls(name, int(top), steps, lr, precision, adapters, adapters_from)

    def also_ranks(self) -> tuple[int, ...]:
        """The lower ranks a run of this variant reads from its one tuning (SVD variants only)."""
        if self.adapters_from != "svd":
            return ()
        return tuple(rank for rank in SVD_ALSO_RANKS if rank < self.adapters)


def class_prefix(labels: Sequence[str], n: int, seed: int) -> list[int]:
    """Indices of the first `n` examples of each label in a seeded order, sorted."""
    order = np.random.default_rng(seed).permutation(len(labels))
    taken: dict[str, int] = defaultdict(int)
    chosen = []
    for i in order.tolist():
        if taken[labels[i]] < n:
            taken[labels[i]] += 1
            chosen.append(i)
    return sorted(chosen)


def knn_probabilities(
    book: np.ndarray, book_labels: np.ndarray, queries: np.ndarray, classes: int
) -> np.ndarray:
    """(Q, C): softmax(similarity / T) over each query's k nearest rows of `book` (unit rows, cosine),
    summed per label."""
    similarity = queries @ book.T  # (Q, N)
    k = min(KNN_K, len(book))
    nearest = np.argsort(-similarity, axis=1)[:, :k]  # (Q, k)
    scores = np.take_along_axis(similarity, nearest, axis=1)  # (Q, k)
    weights = np.exp((scores - scores.max(axis=1, keepdims=True)) / KNN_TEMPERATURE)
    weights /= weights.sum(axis=1, keepdims=True)
    out = np.zeros((len(queries), classes))
    for row in range(len(queries)):
        np.add.at(out[row], book_labels[nearest[row]], weights[row])
    return out


def logistic_probabilities(
    book: np.ndarray, book_labels: np.ndarray, queries: np.ndarray, classes: int
) -> np.ndarray:
    """(Q, C): a logistic regression fitted on the book (sklearn's defaults, as SetFit's head)."""
    from sklearn.linear_model import LogisticRegression

    head = LogisticRegression(max_iter=1000).fit(book, book_labels)
    out = np.zeros((len(queries), classes))
    out[:, head.classes_] = head.predict_proba(queries)
    return out


# Probe 2's adopted mix: P = w·P_head + (1 − w)·P_LM, w = n / (n + HEAD_MIX_N0) for n examples per class
HEAD_MIX_N0 = 1.0


def head_readings(
    book: np.ndarray,
    book_labels: np.ndarray,
    queries: dict[str, np.ndarray | None],  # "dev" and "test": the reader's unit embeddings of the queries
    p_lm: dict[str, np.ndarray | None],  # the same queries' calibrated P_LM
    gold: dict[str, np.ndarray | None],  # their label indices (OUT_OF_SCOPE rows are not scored)
    classes: int,
) -> dict[str, dict[str, float | None]]:
    """Probe 2's head read on a trained run: a logistic regression on the reader's embeddings of the
    book (`head`), and mixed with P_LM at w = n / (n + HEAD_MIX_N0) (`head-mix`), each with its dev and
    test accuracy (test None in a dev-only run)."""
    n = len(book_labels) / len(np.unique(book_labels))
    w = n / (n + HEAD_MIX_N0)
    out: dict[str, dict[str, float | None]] = {"head": {}, "head-mix": {}}
    for split in ("dev", "test"):
        rows, labels, prior = queries[split], gold[split], p_lm[split]
        key = "dev_accuracy" if split == "dev" else "accuracy"
        if rows is None or labels is None or prior is None:
            out["head"][key] = out["head-mix"][key] = None
            continue
        head = logistic_probabilities(book, book_labels, rows, classes)
        inside = labels >= 0
        out["head"][key] = accuracy(head[inside], labels[inside]) / 100
        out["head-mix"][key] = accuracy((w * head + (1 - w) * prior)[inside], labels[inside]) / 100
    return out


def accuracy(probabilities: np.ndarray, gold: np.ndarray) -> float:
    return float((np.asarray(probabilities).argmax(1) == gold).mean() * 100)


def _rounded(p: np.ndarray) -> list[list[float]]:
    return np.round(p, 4).tolist()


def probe_run(
    *,
    task: str,
    seed: int,
    shots: int,
    variant: Variant,
    labels: Sequence[str],
    train: tuple[Sequence[str], Sequence[str]],
    dev: tuple[Sequence[str], Sequence[str]],
    p_lm_dev: np.ndarray,
    frozen: Any,
    base: Any,
) -> list[dict[str, Any]]:
    """One run's records: the variant's, then one per `variant.also_ranks()` (the same tuning's adapters
    cut to that rank, the variant named `{name}r{rank}`). `frozen` is an untuned SentenceReader, `base`
    the SharedEncoder cut for `variant.top_layers` (its lower states cached across runs)."""
    from openbook.sentence_reader import ReaderConfig, SentenceReader
    from openbook.split_encoder import pack_state, truncated_adapters, unpack_state

    train_texts, train_labels = train
    dev_texts, dev_labels = dev
    chosen = class_prefix(train_labels, shots, seed)
    book_texts = [train_texts[i] for i in chosen]
    book_labels = np.array([labels.index(train_labels[i]) for i in chosen])
    gold = np.array([labels.index(label) for label in dev_labels])
    classes = len(labels)
    frozen_knn = knn_probabilities(frozen.embed(book_texts), book_labels, frozen.embed(dev_texts), classes)
    reader = SentenceReader(base)
    config = ReaderConfig(
        encoder=base.name,
        max_length=base.max_length,
        top_layers=variant.top_layers,
        steps=variant.steps,
        lr=variant.lr,
        seed=seed,
        precision=variant.precision,  # type: ignore[arg-type]  # ReaderConfig checks it
        adapters=variant.adapters,
        adapters_from=variant.adapters_from,  # type: ignore[arg-type]  # ReaderConfig checks it
    )
    started = time.perf_counter()
    losses = reader.tune(book_texts, [train_labels[i] for i in chosen], config)
    tune_seconds = time.perf_counter() - started
    readers = [(variant.name, reader)]
    for rank in variant.also_ranks():  # packed again after the cut (A's rows keep their scales)
        assert reader.layers is not None
        cut = pack_state(truncated_adapters(unpack_state(reader.layers), rank))
        readers.append((f"{variant.name}r{rank}", SentenceReader(base, cut, reader.config)))
    records = []
    for name, tuned in readers:
        book, queries = tuned.embed(book_texts), tuned.embed(dev_texts)
        knn = knn_probabilities(book, book_labels, queries, classes)
        logistic = logistic_probabilities(book, book_labels, queries, classes)
        records.append(
            {
                "task": task,
                "seed": seed,
                "shots": shots,
                "variant": name,
                "labels": list(labels),
                "lm": accuracy(p_lm_dev, gold),
                "frozen_knn": accuracy(frozen_knn, gold),
                "knn": accuracy(knn, gold),
                "logreg": accuracy(logistic, gold),
                "tune_s": tune_seconds,
                "loss": [losses[0], losses[-1]],
                "gold": gold.tolist(),
                "p": {
                    "lm": _rounded(p_lm_dev),
                    "frozen_knn": _rounded(frozen_knn),
                    "knn": _rounded(knn),
                    "logreg": _rounded(logistic),
                },
            }
        )
    return records
