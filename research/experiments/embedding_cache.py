"""The embeddings a grid reads: an untrained classifier's, cached between runs of the same grid
(`embed_once`), and the kNN queries of a classifier's book (`in_book_space`: a sentence reader's where it
has one)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
from openbook.atomic import staging_name
from openbook.classifier import Classifier
from openbook.predictions import Embeddings
from openbook.prompting import TextInput

CACHE_CHUNK = 512  # texts per cached file: a grid stopped mid-way keeps what it embedded


def embed_once(
    classifier: Classifier, texts: list[TextInput], cache_dir: Path | None, *, progress: str | bool
) -> Embeddings:
    """`classifier.embed(texts)`, kept in `cache_dir` for the next run of the same grid.

    An untrained classifier embeds the same texts the same way every run, and on a task of many labels
    that is most of a grid's time (clinc150 at 150 labels: the 5,500 test queries and each seed's 3,000
    train and dev texts, hours on a CPU), so a grid that resumes reads them back instead. They are kept
    in chunks of CACHE_CHUNK texts, each file named after its texts and everything that shapes the
    embeddings (backbone, prompt, label words, length, label scoring) and written whole or not at all,
    so a run stopped mid-way resumes at the first chunk it had not finished."""
    if cache_dir is None or not texts:
        return classifier.embed(texts, progress=progress)
    setting = [
        classifier.backbone.config.name,
        classifier.backbone.config.max_length,
        classifier.backbone.config.layer,
        classifier.template.source,
        list(classifier.verbalizer.labels),
        list(classifier.verbalizer.words),
        classifier.label_scoring,
    ]
    if classifier.reader is not None:  # an untuned reader's embeddings go with them
        base = classifier.reader.base
        setting += [base.name, base.weights_sha256, base.top_layers, base.max_length]
        assert classifier.reader.layers is None, "a tuned reader's embeddings are its run's own"
    parts = []
    starts = range(0, len(texts), CACHE_CHUNK)
    for number, start in enumerate(starts, 1):
        chunk = texts[start : start + CACHE_CHUNK]
        digest = hashlib.sha256(json.dumps([*setting, chunk]).encode()).hexdigest()[:16]
        path = Path(cache_dir) / f"embeddings-{digest}.npz"
        if path.is_file():
            with np.load(path) as stored:
                read = stored["reader_vectors"] if "reader_vectors" in stored.files else None
                parts.append(Embeddings(stored["vectors"], stored["lm_log_probs"], stored["truncated"], read))
            continue
        part = f" {number}/{len(starts)}" if len(starts) > 1 else ""
        embedded = classifier.embed(chunk, progress=f"{progress}{part}" if progress else False)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_name(path)
        with staging.open("wb") as handle:
            np.savez(handle, **{k: v for k, v in dataclasses.asdict(embedded).items() if v is not None})
        staging.replace(path)
        parts.append(embedded)
    return Embeddings(
        np.concatenate([p.vectors for p in parts]),
        np.concatenate([p.lm_log_probs for p in parts]),
        np.concatenate([p.truncated for p in parts]),
        None if classifier.reader is None else np.concatenate([p.reader_vectors for p in parts]),
    )


def in_book_space(classifier: Classifier, embedded: Embeddings) -> Embeddings:
    """`embedded` with the queries of the classifier's kNN book as its vectors (a sentence reader's, where
    it has one), so that the selection and readings read the book the classifier serves."""
    if classifier.reader is None:
        return embedded
    return dataclasses.replace(embedded, vectors=classifier.knn_queries(embedded))
