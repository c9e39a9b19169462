"""First use, probed: how a fresh task answers before any training, as the service starts one.

A sentiment task with the service's untrained defaults (content-free calibration, the default kNN
settings, λ chosen on the stored examples, each left out in turn: `selection.lambda_on_store`), four
examples per label written for this check, then near-paraphrases of those examples and plain probes
classified. `python -m research first-use --probes` writes what `probe` returns (the first-use row of
docs/results.md reads it); tests/test_classifier.py asserts the same on the registered backbones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.prompting import Template, Verbalizer
from openbook.selection import lambda_on_store
from openbook.sentence_reader import SentenceReader

TEMPLATE = "Review: {text}\nSentiment: {mask}"
LABELS = "0=negative,1=positive"
P_KNN_FLOOR = 0.8  # what a near-paraphrase's P_kNN must put on its example's label

EXAMPLES = [
    ("The plot dragged on forever and I nearly fell asleep.", "0"),
    ("The food arrived cold and the waiter ignored us all night.", "0"),
    ("This phone stopped charging after two days, a waste of money.", "0"),
    ("The actors seemed bored and the jokes never landed.", "0"),
    ("A warm, funny film that left the whole audience smiling.", "1"),
    ("The staff were friendly and the pasta was delicious.", "1"),
    ("The battery lasts for days and the screen is gorgeous.", "1"),
    ("An inspiring book that I could not put down.", "1"),
]
PARAPHRASES = [  # one per example, in the same order
    "The story dragged on endlessly and I almost fell asleep.",
    "Our food came cold and the waiter ignored us the whole night.",
    "This phone quit charging after two days, such a waste of money.",
    "The cast looked bored and none of the jokes landed.",
    "A warm and funny movie that left the entire audience smiling.",
    "The staff was friendly and the pasta was delicious.",
    "Battery lasts for days and the display is gorgeous.",
    "An inspiring book that I just could not put down.",
]
PROBES = [
    ("I loved every minute of it.", "1"),
    ("Absolutely terrible, I want my money back.", "0"),
    ("What a wonderful experience.", "1"),
    ("The worst service I have ever had.", "0"),
    ("Great value and it works perfectly.", "1"),
    ("It broke the first time I used it.", "0"),
]


def fresh_task(backbone: Backbone, reader: SentenceReader | None = None) -> tuple[Classifier, np.ndarray]:
    """The task, holding EXAMPLES, and their ids in its store; with a `reader`, its book keyed by it."""
    classifier = Classifier(backbone, Template(TEMPLATE), Verbalizer.parse(LABELS), reader=reader)
    classifier.label_bias = classifier.calibration_bias("content-free")
    texts, labels = [text for text, _ in EXAMPLES], [label for _, label in EXAMPLES]
    embedded = classifier.embed(texts, vectors_only=True)
    ids = classifier.add_embeddings(embedded, labels, texts=texts)
    classifier.knn = lambda_on_store(classifier, ids, embedded.lm_log_probs)
    return classifier, ids


def probe(classifier: Classifier, ids: np.ndarray) -> dict[str, Any]:
    """Each paraphrase and probe as the task answers it, and the counts the first-use target reads: a
    paraphrase is known when it gets its example's label, finds that example nearest, and P_kNN puts at
    least P_KNN_FLOOR on the label."""
    paraphrases, known = [], 0
    pairs = zip(PARAPHRASES, EXAMPLES, ids, classifier.predict(PARAPHRASES), strict=True)
    for text, (example, label), example_id, p in pairs:
        nearest = bool(p.neighbours) and p.neighbours[0].id == int(example_id)
        p_knn = None if p.p_knn is None else p.p_knn[label]
        known += p.label == label and nearest and p_knn is not None and p_knn >= P_KNN_FLOOR
        paraphrases.append(
            {"text": text, "example": example, "label": label, "predicted": p.label}
            | {"nearest_is_example": nearest, "p_knn_label": None if p_knn is None else round(p_knn, 4)}
        )
    probed = classifier.predict([text for text, _ in PROBES])
    probes = [
        {"text": text, "label": label, "predicted": p.label, "p_label": round(p.probabilities[label], 4)}
        for (text, label), p in zip(PROBES, probed, strict=True)
    ]
    return {
        "lam": classifier.knn.lam,
        "paraphrases_known": known,
        "probes_right": sum(p["predicted"] == p["label"] for p in probes),
        "paraphrases": paraphrases,
        "probes": probes,
    }
