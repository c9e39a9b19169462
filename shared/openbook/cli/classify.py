"""`openbook classify`: classify texts with a store built from labelled examples, or a checkpoint."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from openbook.calibration import CALIBRATION_MODES, CalibrationMode
from openbook.cli.common import add_label_scoring_argument, add_prompt_arguments, build_classifier
from openbook.data import read_split

if TYPE_CHECKING:
    from openbook.classifier import Prediction


def add_parser(commands: argparse._SubParsersAction) -> None:
    classify = commands.add_parser(
        "classify", help="classify texts, with a store built from labelled examples"
    )
    classify.add_argument("texts", nargs="+")
    classify.add_argument("--task", help="preset name for the template and labels")
    classify.add_argument("--examples", help="labelled examples for the store (.tsv/.csv, as in eval)")
    classify.add_argument("--checkpoint", help="a trained classifier from `openbook train`")
    classify.add_argument("--k", type=int, default=8)
    classify.add_argument("--temperature", type=float, default=0.1)
    classify.add_argument("--lam", type=float, default=0.5)
    classify.add_argument(
        "--calibration",
        choices=CALIBRATION_MODES,
        help="default: domain (over the --examples texts) when examples are given, else content-free",
    )
    add_prompt_arguments(classify)
    add_label_scoring_argument(classify)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.knn import KnnConfig

    if args.checkpoint:
        from openbook.checkpoints import load_classifier

        checkpointed, _ = load_classifier(args.checkpoint, device=args.device)
        for text, prediction in zip(args.texts, checkpointed.predict(args.texts), strict=True):
            print(json.dumps({"text": text, **_as_json(prediction)}))
        return
    classifier = build_classifier(args, args.task)
    classifier.knn = KnnConfig(k=args.k, temperature=args.temperature, lam=args.lam)
    domain_scores = None
    if args.examples:
        examples = read_split(args.examples)
        from openbook.experiments.evaluation import example_labels

        example_labels(classifier, examples)  # an unknown label fails, naming its line, before any forward
        embeddings = classifier.embed([e.text for e in examples])
        classifier.add_embeddings(embeddings, [e.label for e in examples], texts=[e.text for e in examples])
        domain_scores = embeddings.lm_log_probs
    mode: CalibrationMode = args.calibration or ("domain" if args.examples else "content-free")
    classifier.label_bias = classifier.calibration_bias(mode, domain_scores)
    for text, prediction in zip(args.texts, classifier.predict(args.texts), strict=True):
        print(json.dumps({"text": text, **_as_json(prediction)}))


def _as_json(prediction: Prediction) -> dict:
    from dataclasses import asdict

    return asdict(prediction)
