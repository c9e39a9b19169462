"""The `openbook` command: eval, train, methods, classify, bench, prepare."""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    from openbook.training import TrainConfig

USER_ERRORS = (PromptError, DataError, FileNotFoundError, ValueError)  # MethodError, CheckpointError too


def _add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help="registered name, local path or hub id")
    parser.add_argument("--template", help="e.g. '{text} It was {mask}' (default: the task's preset)")
    parser.add_argument("--labels", help="label=word pairs, e.g. '0=terrible,1=great' (default: preset)")
    parser.add_argument("--layer", type=int, default=-1, help="hidden layer of the slot representation")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per prompt; longer texts are cut")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--device", type=_device, default="auto", help="cpu, cuda, cuda:N; auto: cuda when present"
    )


def _add_training_arguments(parser: argparse.ArgumentParser) -> None:
    from openbook.training import TrainConfig

    default = TrainConfig()
    group = parser.add_argument_group("training (trainable methods)")
    group.add_argument("--steps", type=int, default=default.steps, help="most optimiser steps per run")
    group.add_argument("--train-batch-size", type=int, default=default.batch_size)
    group.add_argument("--lr", type=float, default=default.lr)
    group.add_argument("--eval-every", type=int, default=default.eval_every, help="steps between dev checks")
    group.add_argument("--patience", type=int, default=default.patience, help="dev checks without gain")
    group.add_argument("--reembed-every", type=int, help="steps between store re-embeddings (default: epoch)")


def _train_config(args: argparse.Namespace, seed: int) -> TrainConfig:
    from openbook.training import TrainConfig

    return TrainConfig(
        steps=args.steps,
        batch_size=args.train_batch_size,
        lr=args.lr,
        eval_every=args.eval_every,
        patience=args.patience,
        reembed_every=args.reembed_every,
        seed=seed,
    )


def _device(name: str) -> str:
    from openbook.backbone import resolve_device

    return resolve_device(name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openbook", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    evaluate = commands.add_parser("eval", help="k-shot evaluation: select on dev, report on test")
    evaluate.add_argument(
        "--data", required=True, help="directory in the k-shot layout (<task>/16-<seed>/...)"
    )
    evaluate.add_argument("--task", required=True, help="a task, or several separated by commas")
    evaluate.add_argument(
        "--methods",
        default="zero-shot,knn,knn-interp",
        help="inference methods and trainable methods (see `openbook methods`), e.g. prompt-ft,retroprompt",
    )
    evaluate.add_argument("--seeds", default="13,21,42,87,100")
    evaluate.add_argument("--shots", type=int, default=16)
    evaluate.add_argument(
        "--full",
        action="store_true",
        help="fully supervised: --data is the full/ directory (label<space>text files, see data.FULL_LAYOUT);"
        " trainable methods only, each seed a training seed",
    )
    evaluate.add_argument(
        "--full-dev-size", type=int, default=256, help="with --full: dev examples sampled for the dev checks"
    )
    evaluate.add_argument(
        "--test-size",
        type=int,
        help="score every run on a fixed sample (seed 0) of this many test examples; default: all",
    )
    evaluate.add_argument("--calibration", choices=CALIBRATION_MODES, default="domain")
    evaluate.add_argument("--out", required=True, help="results directory; runs already in it are skipped")
    _add_prompt_arguments(evaluate)
    _add_training_arguments(evaluate)

    training = commands.add_parser("train", help="train a method on a k-shot split and save a checkpoint")
    training.add_argument("--data", required=True, help="directory in the k-shot layout")
    training.add_argument("--task", required=True)
    training.add_argument("--method", required=True, help="e.g. prompt-ft, retroprompt, retroprompt/beta=0.5")
    training.add_argument(
        "--seed", type=int, required=True, help="data split 16-<seed>, also the training seed"
    )
    training.add_argument("--shots", type=int, default=16)
    training.add_argument("--out", required=True, help="checkpoint directory to create")
    training.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint")
    training.add_argument("--init", help="continue from this checkpoint (same method, same labels)")
    for flag in ("demos", "knn-loss", "knn-infer"):
        training.add_argument(f"--no-{flag}", action="append_const", const=f"no-{flag}", dest="options")
    _add_prompt_arguments(training)
    _add_training_arguments(training)

    commands.add_parser("methods", help="list the inference and trainable methods")

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
    _add_prompt_arguments(classify)

    bench = commands.add_parser("bench", help="performance benchmarks (ratios, not pass/fail)")
    bench.add_argument("what", choices=["store", "train"])
    bench.add_argument("--sizes", default="10000,100000", help="store sizes (bench store)")
    bench.add_argument(
        "--train-batch-size", type=int, default=8, help="batch of a training step (bench train)"
    )
    bench.add_argument("--repeats", type=int, default=5, help="timed repeats, median reported (bench train)")
    _add_prompt_arguments(bench)

    continual = commands.add_parser(
        "continual",
        help="class-incremental sequence of k-shot tasks: average accuracy and forgetting",
        description="Here --template is one template for every stage (default: the continual module's) "
        "and --labels gives task:label=word pairs over the built-in words, e.g. 'SST-2:0=bad,SST-2:1=good'.",
    )
    continual.add_argument("--data", required=True, help="directory in the k-shot layout")
    continual.add_argument("--stages", default="SST-2,trec,mpqa", help="tasks in the order they arrive")
    continual.add_argument("--methods", default="l2p,prompt-ft,retroprompt", help="trainable methods")
    continual.add_argument("--seeds", default="13")
    continual.add_argument("--shots", type=int, default=16)
    continual.add_argument("--test-size", type=int, default=300, help="fixed test sample per stage")
    continual.add_argument("--calibration", choices=["none", "domain"], default="none")
    continual.add_argument("--out", required=True, help="results directory; runs already in it are skipped")
    _add_prompt_arguments(continual)
    _add_training_arguments(continual)

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


def run_train(args: argparse.Namespace) -> None:
    from openbook.checkpoints import examples_sha256, load_classifier, save_classifier
    from openbook.data import load_kshot
    from openbook.evaluation import example_labels
    from openbook.methods import build_method, weights_sha256
    from openbook.training import train
    from openbook.training_eval import choose_knn_on_dev

    spec = "/".join([args.method, *(args.options or [])])
    method = build_method(spec)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists; pass --overwrite to replace it")
    splits = load_kshot(args.data, args.task, args.seed, args.shots)
    if args.init:
        base, init_method = load_classifier(args.init, device=args.device)
        if init_method.name != method.name:
            raise ValueError(f"--init checkpoint was trained with {init_method.name}, not {method.name}")
        data_labels = sorted({e.label for e in splits.train + splits.dev})
        if data_labels != sorted(base.labels):
            raise ValueError(
                f"the checkpoint's labels {sorted(base.labels)} differ from the data's labels {data_labels}"
            )
    else:
        base = _classifier(args, args.task)
    base_sha = (
        weights_sha256(base.backbone.model)
        if not args.init  # the loaded checkpoint was verified: its manifest names the base weights
        else json.loads((Path(args.init) / "manifest.json").read_text())["backbone"]["weights_sha256"]
    )
    classifier = method.prepare(dataclasses.replace(base, store=None, label_bias=None))
    train_labels = example_labels(classifier, splits.train)
    dev_labels = example_labels(classifier, splits.dev)
    dev_texts = [e.text for e in splits.dev]
    config = _train_config(args, args.seed)
    result = train(
        classifier, method, [e.text for e in splits.train], train_labels, dev_texts, dev_labels, config
    )
    dev_metrics: dict = {
        "accuracy": result.best.accuracy,
        "best_step": result.best.step,
        "steps_run": result.steps_run,
    }
    if method.inference == "knn-interp":
        classifier.knn, dev_metrics["accuracy_with_knn"] = choose_knn_on_dev(
            classifier, dev_texts, dev_labels
        )
    else:
        classifier.knn = dataclasses.replace(classifier.knn, lam=0.0)  # the prompt alone
    path = save_classifier(
        out,
        classifier,
        method,
        base_weights_sha256=base_sha,
        train_config=config,
        training_data_sha256=examples_sha256(splits.train),
        dev_metrics=dev_metrics,
        overwrite=args.overwrite,
    )
    print(
        json.dumps(
            {"checkpoint": str(path), "method": method.spec, "dev": dev_metrics, "seconds": result.seconds}
        )
    )


def run_methods() -> None:
    from openbook.evaluation import INFERENCE_METHODS
    from openbook.methods import METHODS

    for name, fn in INFERENCE_METHODS.items():
        print(f"{name:<14} (inference) {(fn.__doc__ or '').strip().splitlines()[0]}")
    for name, cls in METHODS.items():
        print(f"{name:<14} (trains)    {cls.summary}")


def run_classify(args: argparse.Namespace) -> None:
    from openbook.knn import KnnConfig

    if args.checkpoint:
        from openbook.classifier import Classifier

        checkpointed = Classifier.from_checkpoint(args.checkpoint, device=args.device)
        for text, prediction in zip(args.texts, checkpointed.predict(args.texts), strict=True):
            print(json.dumps({"text": text, **_as_json(prediction)}))
        return
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
            from openbook.cli_eval import run_eval

            run_eval(args, argv)
        elif args.command == "train":
            run_train(args)
        elif args.command == "methods":
            run_methods()
        elif args.command == "classify":
            run_classify(args)
        elif args.command == "bench":
            from openbook.bench import run_store_bench, run_train_bench

            (run_store_bench if args.what == "store" else run_train_bench)(args)
        elif args.command == "continual":
            from openbook.cli_continual import run_continual

            run_continual(args, argv)
        elif args.command == "prepare":
            from openbook.models import resolve_backbone

            print(resolve_backbone(args.backbone))
    except USER_ERRORS as error:
        print(f"openbook {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
