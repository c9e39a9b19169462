"""`openbook classify`: classify texts with a store built from labelled examples, or a checkpoint."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from openbook.calibration import CALIBRATION_MODES
from openbook.cli.common import add_label_scoring_argument, add_prompt_arguments, classifier_from_args
from openbook.data import read_split
from openbook.untrained import UNTRAINED_CALIBRATION, UNTRAINED_KNN

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
    # The defaults are an untrained service task's (openbook.untrained), so both serve the same classifier.
    classify.add_argument("--k", type=int, default=UNTRAINED_KNN.k)
    classify.add_argument("--temperature", type=float, default=UNTRAINED_KNN.temperature)
    classify.add_argument(
        "--lam", type=float, help="weight of P_kNN (default: chosen on the --examples, each left out in turn)"
    )
    classify.add_argument(
        "--calibration",
        choices=CALIBRATION_MODES,
        default=UNTRAINED_CALIBRATION,
        help="of P_LM; domain: over the --examples texts (default: %(default)s)",
    )
    add_prompt_arguments(classify)
    add_label_scoring_argument(classify)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    if args.checkpoint:
        from openbook.checkpoints import load_classifier

        checkpointed, _ = load_classifier(args.checkpoint, device=args.device)
        for text, prediction in zip(args.texts, checkpointed.predict(args.texts), strict=True):
            print(json.dumps({"text": text, **_as_json(prediction)}))
        return
    if args.calibration == "domain" and not args.examples:
        raise ValueError("--calibration domain measures the prior over the --examples texts: give --examples")
    import dataclasses

    from openbook.selection import lambda_on_store

    knn = dataclasses.replace(
        UNTRAINED_KNN,
        k=args.k,
        temperature=args.temperature,
        lam=UNTRAINED_KNN.lam if args.lam is None else args.lam,
    )
    classifier = classifier_from_args(args, args.task, knn=knn, calibration=args.calibration)
    if args.examples:
        examples = read_split(args.examples)
        from openbook.data import example_labels

        example_labels(classifier, examples)  # an unknown label fails, naming its line, before any forward
        embeddings = classifier.embed([e.text for e in examples])
        ids = classifier.add_embeddings(
            embeddings, [e.label for e in examples], texts=[e.text for e in examples]
        )
        if args.calibration == "domain":
            classifier.label_bias = classifier.calibration_bias("domain", embeddings.lm_log_probs)
        if args.lam is None:  # as an untrained service task chooses it (selection.lambda_on_store)
            classifier.knn = lambda_on_store(classifier, ids, embeddings.lm_log_probs)
    for text, prediction in zip(args.texts, classifier.predict(args.texts), strict=True):
        print(json.dumps({"text": text, **_as_json(prediction)}))


def _as_json(prediction: Prediction) -> dict:
    from dataclasses import asdict

    return asdict(prediction)
