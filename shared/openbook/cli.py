"""The `openbook` command: eval, bench, classify, prepare."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from openbook.calibration import CALIBRATION_MODES, label_bias
from openbook.data import DataError, read_split
from openbook.models import DEFAULT_BACKBONE
from openbook.prompting import PromptError, Template, Verbalizer, get_preset

if TYPE_CHECKING:
    from openbook.classifier import Classifier, Prediction

USER_ERRORS = (PromptError, DataError, FileNotFoundError, ValueError)


def _add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help="registered name, local path or hub id")
    parser.add_argument("--template", help="e.g. '{text} It was {mask}' (default: the task's preset)")
    parser.add_argument("--labels", help="label=word pairs, e.g. '0=terrible,1=great' (default: preset)")
    parser.add_argument("--layer", type=int, default=-1, help="hidden layer of the slot representation")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per prompt; longer texts are cut")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openbook", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    evaluate = commands.add_parser("eval", help="k-shot evaluation: select on dev, report on test")
    evaluate.add_argument(
        "--data", required=True, help="directory in the k-shot layout (<task>/16-<seed>/...)"
    )
    evaluate.add_argument("--task", required=True)
    evaluate.add_argument("--methods", default="zero-shot,knn,knn-interp")
    evaluate.add_argument("--seeds", default="13,21,42,87,100")
    evaluate.add_argument("--shots", type=int, default=16)
    evaluate.add_argument("--calibration", choices=CALIBRATION_MODES, default="domain")
    evaluate.add_argument("--out", required=True)
    _add_prompt_arguments(evaluate)

    classify = commands.add_parser(
        "classify", help="classify texts, with a store built from labelled examples"
    )
    classify.add_argument("texts", nargs="+")
    classify.add_argument("--task", help="preset name for the template and labels")
    classify.add_argument("--examples", help="labelled examples for the store (.tsv/.csv, as in eval)")
    classify.add_argument("--k", type=int, default=8)
    classify.add_argument("--temperature", type=float, default=0.1)
    classify.add_argument("--lam", type=float, default=0.5)
    classify.add_argument(
        "--calibration",
        choices=CALIBRATION_MODES,
        help="default: domain (over the --examples texts) when examples are given, else content-free",
    )
    _add_prompt_arguments(classify)

    bench = commands.add_parser("bench", help="performance benchmarks (ratios, not pass/fail)")
    bench.add_argument("what", choices=["store"])
    bench.add_argument("--sizes", default="10000,100000")
    _add_prompt_arguments(bench)

    prepare = commands.add_parser("prepare", help="convert and cache a packaged backbone (offline)")
    prepare.add_argument("--backbone", default=DEFAULT_BACKBONE)
    return parser


def prompt_for(
    task: str | None, template: str | None, labels: str | None, kind: str
) -> tuple[Template, Verbalizer]:
    if template and labels:
        return Template(template), Verbalizer.parse(labels)
    if task is None:
        raise PromptError("give --task with a preset, or both --template and --labels")
    preset = get_preset(task)
    return (Template(template) if template else preset.template(kind)), (
        Verbalizer.parse(labels) if labels else preset.verbalizer(kind)
    )


def _classifier(args: argparse.Namespace, task: str | None) -> Classifier:
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier

    backbone = load_backbone(
        BackboneConfig(name=args.backbone, layer=args.layer, max_length=args.max_length, device=args.device)
    )
    template, verbalizer = prompt_for(task, args.template, args.labels, backbone.kind)
    return Classifier(backbone, template, verbalizer, batch_size=args.batch_size)


def run_eval(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.evaluation import evaluate_task, write_results

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    classifier = _classifier(args, args.task)
    records = evaluate_task(
        classifier, args.data, args.task, methods, seeds, calibration=args.calibration, shots=args.shots
    )
    header = (
        f"# {args.task}: {args.shots}-shot, seeds {args.seeds}, backbone {args.backbone}\n\n"
        f"Template {json.dumps(classifier.template.source)}, labels `{classifier.verbalizer}`. "
        "Accuracy and macro-F1 on test in %, mean (std) over seeds; "
        "every hyper-parameter chosen on dev.\n\n"
        f"Command: `openbook {shlex.join(argv)}`\n\n"
    )
    write_results(records, args.out, header)
    print((Path(args.out) / "results.md").read_text())


def run_classify(args: argparse.Namespace) -> None:
    from openbook.knn import KnnConfig

    classifier = _classifier(args, args.task)
    classifier.knn = KnnConfig(k=args.k, temperature=args.temperature, lam=args.lam)
    domain_scores = None
    if args.examples:
        examples = read_split(args.examples)
        from openbook.evaluation import example_labels

        example_labels(classifier, examples)  # an unknown label fails, naming its line, before any forward
        embeddings = classifier.embed([e.text for e in examples])
        classifier.add_embeddings(embeddings, [e.label for e in examples])
        domain_scores = embeddings.lm_log_probs
    mode = args.calibration or ("domain" if args.examples else "content-free")
    classifier.label_bias = label_bias(mode, classifier, domain_scores)
    for text, prediction in zip(args.texts, classifier.predict(args.texts), strict=True):
        print(json.dumps({"text": text, **_as_json(prediction)}))


def _as_json(prediction: Prediction) -> dict:
    from dataclasses import asdict

    return asdict(prediction)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "eval":
            run_eval(args, argv)
        elif args.command == "classify":
            run_classify(args)
        elif args.command == "bench":
            from openbook.bench import run_store_bench

            run_store_bench(args)
        elif args.command == "prepare":
            from openbook.models import resolve_backbone

            print(resolve_backbone(args.backbone))
    except USER_ERRORS as error:
        print(f"openbook {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
