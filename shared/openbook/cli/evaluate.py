"""`openbook eval`: how good one classifier is on a user's own labelled data.

    openbook eval --checkpoint DIR --data FILE          a checkpoint (`openbook train`, a service job)
    openbook eval --task T [--examples FILE] --data FILE   the untrained task `openbook classify` builds
    openbook eval ... --data DIR --task T --seed S      a k-shot split (<T>/16-<S>/...): its test set

FILE holds labelled examples, .csv, .tsv or .jsonl (openbook/data.py). Printed: accuracy, macro-F1 and
the quality report `openbook report` prints of a version (per label, confusion, calibration, the
thresholds, suspect examples); with --json, the report as JSON. Without a checkpoint the store holds the
--examples, or else the k-shot split's training examples. The lab's resumable grid of methods x seeds
is `python -m research eval`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openbook.cli.classify import add_classifier_arguments
from openbook.cli.common import add_data_argument

if TYPE_CHECKING:
    from openbook.classifier import Classifier
    from openbook.data import Example


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser(
        "eval",
        help="score one classifier on your labelled data: accuracy, macro-F1, the quality report",
        description="How good one classifier is on your labelled data: a checkpoint, or the untrained "
        "task that `openbook classify` builds.",
    )
    add_data_argument(
        evaluate,
        "k-shot",
        "a labelled .csv, .tsv or .jsonl file; or a directory in the k-shot layout, with --task and --seed",
    )
    evaluate.add_argument("--seed", type=int, help="with a k-shot directory: the split 16-<seed> (--shots)")
    evaluate.add_argument("--shots", type=int, default=16, help="with a k-shot directory: examples per label")
    evaluate.add_argument("--json", action="store_true", help="print the report as JSON")
    add_classifier_arguments(evaluate)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.cli.classify import classifier_of
    from openbook.cli.report_text import format_report
    from openbook.data import read_split

    if args.checkpoint and args.examples:
        raise ValueError("--examples fill an untrained task's store; a checkpoint brings its own")
    scored_by, test, train = _data(args)  # unreadable data fails before any model is loaded
    examples = read_split(args.examples) if args.examples else train  # a checkpoint has its own
    classifier = classifier_of(args, examples)
    report = _report(classifier, test) | {"scored_by": scored_by}
    if args.checkpoint:
        manifest = json.loads((Path(args.checkpoint) / "manifest.json").read_text())  # verified on load
        version = manifest.get("version", Path(args.checkpoint).name)
        report |= {"checkpoint": args.checkpoint, "model_version": version}
    else:
        report |= {"task": args.task or "the untrained task", "model_version": "base"}
    print(json.dumps(report, indent=2) if args.json else format_report(report))


def _data(args: argparse.Namespace) -> tuple[str, list[Example], list[Example]]:
    """What is scored, named; its examples; and the training examples that go with them (a k-shot
    split's; none for a file)."""
    from openbook.data import load_kshot, read_split

    path = Path(args.data)
    if not path.is_dir():
        return str(path), read_split(path), []
    if args.task is None or args.seed is None:
        raise ValueError(f"{path} is a directory: give --task and --seed to score a k-shot split's test set")
    splits = load_kshot(path, args.task, args.seed, args.shots)
    assert splits.test is not None  # read: test=True
    return f"{path / args.task} test (split {args.shots}-{args.seed})", splits.test, splits.train


def _report(classifier: Classifier, test: Sequence[Example]) -> dict[str, Any]:
    """The quality report of `classifier` on `test`, scored as it serves them, read at its confidence
    temperature; each suspect example with its text and where it is (file:line)."""
    import numpy as np

    from openbook.data import example_labels
    from openbook.quality import report_of, score_examples

    example_labels(classifier, test)  # an unknown label fails, naming its line, before any forward
    temperature, classifier.confidence_temperature = classifier.confidence_temperature, 1.0
    try:
        texts, labels = [e.text for e in test], [e.label for e in test]
        scored = score_examples(classifier, texts, labels, np.arange(len(test)))
    finally:
        classifier.confidence_temperature = temperature
    report = report_of(scored, classifier.labels, temperature)
    for suspect in report["suspect_examples"]:
        example = test[suspect["id"]]
        suspect |= {"text": example.text, "source": example.source}
    return report
