"""`python -m research bench labels`: what many multi-token label words cost a task, against two labels.

The same texts on the same backbone, side by side, on a task of many labels (the 150 clinc150 intent
names, e.g. "book flight": mostly two to six tokens each) and on a task of two of them:

1. classify: `Classifier.predict` of `--texts` queries (clinc150 test queries when the data is there,
   else synthetic sentences), against a store of the examples below: the forward that gives the kNN
   query and every label's score, then kNN;
2. add examples: `Classifier.add_examples` of `--examples` texts into an empty store, the path a
   POST of examples takes (store keys only);

each as the median of `--repeats` timed runs after one warm-up, and the ratio many / two, with the
labels scored as `--label-scoring` says for each task (auto, the default: exact scoring for the two
labels and label vectors for the many; or exact, or label vectors, for both). Prints the backbone,
device, dtype and thread count it ran with.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from openbook.timing import median_seconds, synthetic_sentences

CLINC150 = Path("k-shot") / "clinc150"
CAUSAL_TEMPLATE = "Query: {text}\nIntent: {mask}"
MASKED_TEMPLATE = "{text} Intent: {mask} ."
TWO = 2  # the small task: the first two of the many labels


@dataclass(frozen=True)
class LabelBenchData:
    label_words: list[str]  # the many labels' words
    queries: list[str]  # what classify is timed on
    examples: list[str]  # what add_examples is timed on
    source: str  # where they came from, for the printout


def clinc150_data(directory: Path, queries: int, examples: int, seed: int = 13) -> LabelBenchData:
    """The intent names (labels.txt, underscores read as spaces), test queries and seed-13 train texts,
    each drawn with a fixed seed (the files are sorted by intent)."""
    from openbook.data import read_split

    names = [
        line.split("=", 1)[1].replace("_", " ").strip()
        for line in (directory / "labels.txt").read_text().splitlines()
        if line.strip()
    ]
    rng = np.random.default_rng(0)
    test = read_split(directory / "test.csv")
    train = read_split(directory / f"10-{seed}" / "train.csv")
    return LabelBenchData(
        names,
        [str(test[i].text) for i in rng.choice(len(test), queries, replace=False)],
        [str(train[i].text) for i in rng.choice(len(train), examples, replace=False)],
        f"clinc150 ({directory})",
    )


def synthetic_data(labels: int, queries: int, examples: int) -> LabelBenchData:
    """Two-word label names and synthetic sentences, for when the clinc150 data is not there."""
    vocabulary = dict.fromkeys(" ".join(synthetic_sentences(8, seed=2)).split())  # distinct, in order
    names = [f"{a} {b}" for a, b in itertools.islice(itertools.permutations(vocabulary, 2), labels)]
    return LabelBenchData(
        names,
        synthetic_sentences(queries, seed=0),
        synthetic_sentences(examples, seed=1),
        "synthetic (no clinc150 data found)",
    )


def bench_data(args: argparse.Namespace) -> LabelBenchData:
    root = args.data or os.environ.get("OPENBOOK_DATA")
    directory = Path(root) / CLINC150 if root else None
    if directory is not None and (directory / "labels.txt").is_file():
        return clinc150_data(directory, args.texts, args.examples)
    return synthetic_data(150, args.texts, args.examples)


def run_labels_bench(args: argparse.Namespace) -> None:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.prompting import Template, Verbalizer
    from openbook.untrained import build_classifier

    torch.manual_seed(0)
    backbone = load_backbone(
        BackboneConfig(name=args.backbone, max_length=args.max_length, device=args.device)
    )
    data = bench_data(args)
    template = Template(args.template or (CAUSAL_TEMPLATE if backbone.kind == "causal" else MASKED_TEMPLATE))

    def task(words: Sequence[str]) -> Classifier:
        verbalizer = Verbalizer(tuple(str(i) for i in range(len(words))), tuple(words))
        return build_classifier(  # no label bias: the bench times forwards, not predictions' quality
            backbone,
            template,
            verbalizer,
            calibration="none",
            batch_size=args.batch_size,
            label_scoring=args.label_scoring,
        )

    many, two = task(data.label_words), task(data.label_words[:TWO])
    dtype = str(backbone.dtype).removeprefix("torch.")
    print(
        f"backbone {args.backbone} on {backbone.device} ({dtype}), {torch.get_num_threads()} thread(s); "
        f"template {template.source!r}; label scoring {args.label_scoring} (many: {many.label_scoring}, "
        f"two: {two.label_scoring}); data: {data.source}"
    )
    for classifier in (many, two):
        lengths = [len(ids) for ids in classifier.encoder.label_token_ids]
        print(
            f"  {len(lengths):>3} labels: {min(lengths)}-{max(lengths)} tokens a word, "
            f"{sum(n > 1 for n in lengths)} of more than one"
            + (f" ({', '.join(classifier.verbalizer.words)})" if len(lengths) <= TWO else "")
        )
    seconds: dict[str, list[float]] = {"classify": [], "add": []}
    for classifier in (many, two):
        labels = [classifier.labels[i % len(classifier.labels)] for i in range(len(data.examples))]

        def add(classifier: Classifier = classifier, labels: list[str] = labels) -> None:
            classifier.store = classifier.empty_store()
            classifier.add_examples(data.examples, labels)

        def classify(classifier: Classifier = classifier) -> None:  # against the store just filled
            classifier.predict(data.queries)

        seconds["add"].append(median_seconds(add, args.repeats, device=backbone.device))
        seconds["classify"].append(median_seconds(classify, args.repeats, device=backbone.device))
    rows = (
        ("classify", f"classify {len(data.queries)} texts"),
        ("add", f"add {len(data.examples)} examples to the store"),
    )
    for key, what in rows:
        many_s, two_s = seconds[key]
        print(
            f"{what:<34}: {len(many.labels)} labels {many_s:7.2f} s | {TWO} labels {two_s:7.2f} s"
            f" | ratio {many_s / two_s:.2f}x"
        )
