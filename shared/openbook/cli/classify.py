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
    from openbook.classifier import Classifier
    from openbook.data import Example
    from openbook.predictions import Prediction


def add_parser(commands: argparse._SubParsersAction) -> None:
    classify = commands.add_parser(
        "classify", help="classify texts, with a store built from labelled examples"
    )
    classify.add_argument("texts", nargs="+")
    add_classifier_arguments(classify)


def add_classifier_arguments(parser: argparse.ArgumentParser) -> None:
    """The classifier `classify` and `eval` read: a checkpoint, or the untrained task a prompt and
    labelled examples make."""
    parser.add_argument("--task", help="preset name for the template and labels")
    parser.add_argument("--examples", help="labelled examples for the store (.tsv/.csv/.jsonl, as in eval)")
    parser.add_argument("--checkpoint", help="a trained classifier from `openbook train`")
    parser.add_argument(
        "--reader",
        help="the sentence encoder that keys the --examples' book (mpnet, or a sentence-transformers"
        " folder; default: $OPENBOOK_DEFAULT_READER, else mpnet; none: the slot vectors key it); a"
        " checkpoint keeps its own",
    )
    # The defaults are an untrained service task's (openbook.untrained), so both serve the same classifier.
    parser.add_argument("--k", type=int, default=UNTRAINED_KNN.k)
    parser.add_argument("--temperature", type=float, default=UNTRAINED_KNN.temperature)
    parser.add_argument(
        "--lam", type=float, help="weight of P_kNN (default: chosen on the --examples, each left out in turn)"
    )
    parser.add_argument(
        "--calibration",
        choices=CALIBRATION_MODES,
        default=UNTRAINED_CALIBRATION,
        help="of P_LM; domain: over the --examples texts (default: %(default)s)",
    )
    add_prompt_arguments(parser)
    add_label_scoring_argument(parser)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    examples = read_split(args.examples) if args.examples and not args.checkpoint else []
    classifier = classifier_of(args, examples)
    for text, prediction in zip(args.texts, classifier.predict(args.texts), strict=True):
        print(json.dumps({"text": text, **_as_json(prediction)}))


def classifier_of(args: argparse.Namespace, examples: Sequence[Example]) -> Classifier:
    """The checkpoint's classifier, else the untrained task of the prompt arguments with `examples` in
    its store (λ chosen on them as an untrained service task chooses it, unless --lam is given)."""
    if args.checkpoint and args.reader:
        raise ValueError("a checkpoint classifies with the reader it was trained with: drop --reader")
    if args.checkpoint:
        from openbook.checkpoints import load_classifier

        return load_classifier(args.checkpoint, device=args.device)[0]
    if args.calibration == "domain" and not examples:
        raise ValueError("--calibration domain measures the prior over the --examples texts: give --examples")
    import dataclasses

    # lam None (no --lam): chosen on the --examples, each left out in turn, by the classifier itself
    # (openbook.lambda_on_store), as an untrained service task chooses it
    knn = dataclasses.replace(UNTRAINED_KNN, k=args.k, temperature=args.temperature, lam=args.lam)
    from openbook.encoders import chosen_reader

    classifier = classifier_from_args(
        args, args.task, knn=knn, calibration=args.calibration, reader=chosen_reader(args.reader)
    )
    if examples:
        from openbook.data import example_labels

        example_labels(classifier, examples)  # an unknown label fails, naming its line, before any forward
        texts = [e.text for e in examples]
        embeddings = classifier.embed(texts, vectors_only=True)  # the plain prompt's label scores
        classifier.add_embeddings(
            embeddings, [e.label for e in examples], texts=texts, lm_log_probs=embeddings.lm_log_probs
        )
        if args.calibration == "domain":
            classifier.label_bias = classifier.calibration_bias("domain", embeddings.lm_log_probs)
    return classifier


def _as_json(prediction: Prediction) -> dict:
    from dataclasses import asdict

    return asdict(prediction)
