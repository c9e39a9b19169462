"""`python -m research eval`: k-shot (or, with --full, fully supervised) evaluation, resumable."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openbook.calibration import CALIBRATION_MODES
from openbook.cli.common import (
    add_data_argument,
    add_label_scoring_argument,
    add_prompt_arguments,
    add_training_arguments,
    classifier_from_args,
    train_config,
)

from research import PROG
from research.cli.settings import add_knn_arguments, checked_settings, knn_config, knn_settings

if TYPE_CHECKING:
    from openbook.data import KShotSplits

    from research.experiments.evaluation import EvalRecord


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="k-shot evaluation: select on dev, report on test")
    add_data_argument(
        evaluate, "k-shot", "directory in the k-shot layout (<task>/16-<seed>/...); with --full, full/"
    )
    evaluate.add_argument("--task", required=True, help="a task, or several separated by commas")
    evaluate.add_argument(
        "--methods",
        default="zero-shot,knn,knn-interp",
        help="inference methods and trainable methods (see `python -m research methods`), e.g."
        " prompt-ft,retroprompt",
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
    evaluate.add_argument(
        "--no-test",
        action="store_true",
        help="dev only: train and choose as usual, never read the test split, report dev accuracy"
        " (to compare configurations; an --out holds runs of one kind)",
    )
    evaluate.add_argument("--calibration", choices=CALIBRATION_MODES, default="domain")
    evaluate.add_argument(
        "--reader",
        help="a sentence encoder that keys the book (mpnet, or a model folder): the untrained methods read"
        " its neighbours as it comes, each trained method's run tunes it on the training examples first;"
        " not with a peer",
    )
    evaluate.add_argument(
        "--reader-tuning",
        type=_reader_tuning,
        help="with --reader: ReaderConfig's fields other than the defaults, as name=value,... (e.g."
        " top_layers=12,adapters=32,adapters_from=svd,lr=2e-5: probe 7's s12); recorded in settings.json",
    )
    evaluate.add_argument(
        "--keep-distributions",
        action="store_true",
        help="with --reader: keep each trained run's readings' distributions on dev and test in"
        " OUT/distributions/ (for rules read later on how the readers combine; large at many labels)",
    )
    add_knn_arguments(evaluate)
    evaluate.add_argument("--out", required=True, help="results directory; runs already in it are skipped")
    evaluate.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="run the units (a task and seed's untrained methods together, each trained method or peer apart)"
        " as N processes at once into --out (cores / N threads each, or one GPU shared); each unit's output"
        " goes to OUT/logs/",
    )
    add_prompt_arguments(evaluate)
    add_label_scoring_argument(evaluate)
    add_training_arguments(evaluate)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.data import DataError, fixed_sample, load_full, load_kshot
    from openbook.methods import MethodError, build_method
    from openbook.sentence_reader import ReaderConfig

    from research.experiments.evaluation import INFERENCE_METHODS, evaluate_task
    from research.experiments.reports import add_record, check_one_kind, locked, read_results
    from research.experiments.setfit_peer import (
        evaluate_setfit,
        is_peer,
        peer_config,
        peer_spec,
        require_peer,
    )
    from research.experiments.training_eval import evaluate_trained

    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    frozen = [m for m in methods if m in INFERENCE_METHODS]
    # a baseline on its own encoder (setfit_peer.py), named by its canonical spec like a trained method
    peers = {peer_spec(peer_config(m)): peer_config(m) for m in methods if is_peer(m)}
    trainable = [m for m in methods if m not in INFERENCE_METHODS and not is_peer(m)]
    for peer_options in peers.values():
        require_peer(peer_options)  # an optional extra: say how to install it before anything loads
    for spec in trainable:
        try:
            build_method(spec)  # an unknown method or option fails before any model is loaded
        except MethodError as error:
            if "unknown method" not in str(error):
                raise
            raise MethodError(f"{error}; inference methods: {', '.join(INFERENCE_METHODS)}") from None
    # the canonical spelling, so `retroprompt/demos=none` and `retroprompt` are one method
    canonical = {spec: build_method(spec).spec for spec in trainable}
    trainable = list(dict.fromkeys(canonical.values()))
    canonical |= {m: peer_spec(peer_config(m)) for m in methods if is_peer(m)}
    methods = list(dict.fromkeys(canonical.get(m, m) for m in methods))
    if args.full and (frozen or peers):
        raise DataError(
            f"--full evaluates trainable methods only; drop {', '.join([*frozen, *peers])} from --methods"
        )
    if args.no_test and args.test_size is not None:
        raise DataError("--test-size samples the test split, which --no-test never reads: give one of them")
    if args.reader and peers:
        raise DataError(f"--reader keys our book, not a peer's; drop {', '.join(peers)} from --methods")
    config = train_config(args, seeds[0])  # a bad budget or knob fails before anything is written
    if args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")

    def loader(task: str) -> Callable[[int], KShotSplits]:
        def load(seed: int) -> KShotSplits:
            with_test = not args.no_test
            if args.full:
                splits = load_full(args.data, task, seed, args.full_dev_size, test=with_test)
            else:
                splits = load_kshot(args.data, task, seed, args.shots, test=with_test)
            if splits.test is None:
                return splits
            return dataclasses.replace(
                splits,
                test=fixed_sample(splits.test, args.test_size),
                out_of_scope=fixed_sample(splits.out_of_scope, args.test_size),
            )

        return load

    for task in tasks:  # unreadable data fails before any model is loaded or anything written
        blanks = _blank_texts(task, {seed: loader(task)(seed) for seed in seeds})
        if blanks:
            print(blanks, file=sys.stderr)
    records = read_results(args.out)
    check_one_kind(records, args.no_test, args.out)
    check_method_options(records, trainable, args.out)
    knn = knn_config(args)  # a bad kNN option fails before anything is written
    sampled = {} if args.test_size is None else {"test_size": args.test_size}  # recorded only when used
    sampled |= {"reader": args.reader} if args.reader else {}
    if args.reader_tuning:
        if not args.reader:
            raise DataError("--reader-tuning tunes the --reader; name one")
        try:  # a bad value fails before anything is written
            ReaderConfig(encoder=args.reader, **args.reader_tuning)
        except ValueError as error:
            raise DataError(f"--reader-tuning: {error}") from None
        sampled |= {"reader_tuning": args.reader_tuning}
    settings = checked_settings(args, sampled | knn_settings(knn))
    if args.parallel > 1:  # everything above was checked once, here; each unit checks it again
        from research.experiments.reports import write_results
        from research.parallel import Unit, run_units, unit_argv

        # The untrained methods share one embedding of the data, so they stay one unit; each trained
        # method or peer is a unit of its own, so a grid spreads over as many processes as it has runs.
        groups = ([",".join(frozen)] if frozen else []) + [m for m in methods if m not in frozen]
        units = [
            # named by its methods too: a later grid into the same OUT keeps this one's logs
            Unit(
                f"{task}-{seed}-" + group.replace("/", "+"),
                unit_argv(argv, {"--task": task, "--seeds": str(seed), "--methods": group}),
            )
            for task in tasks
            for seed in seeds
            for group in groups
        ]
        run_units(units, Path(args.out) / "logs", args.parallel)
        with locked(args.out) as out:  # the grid's own command in results.md, not its last unit's
            write_results(read_results(out), out, _eval_header(args, argv), method_order=methods)
        print((Path(args.out) / "results.md").read_text())
        return
    done = {(r.task, r.method, r.seed) for r in records}
    classifier = None
    for task in tasks:
        pending_seeds = [s for s in seeds if any((task, m, s) not in done for m in frozen)]
        pending_runs = [(m, s) for m in trainable for s in seeds if (task, m, s) not in done]
        pending_peers = {p: [s for s in seeds if (task, p, s) not in done] for p in peers}
        pending_peers = {p: pending for p, pending in pending_peers.items() if pending}
        if not pending_seeds and not pending_runs and not pending_peers:
            continue
        reader = ReaderConfig(encoder=args.reader, **(args.reader_tuning or {})) if args.reader else None
        classifier = classifier_from_args(args, task, reader=reader)
        classifier.knn = knn

        def save(record):
            # another `python -m research eval` may share this directory (disjoint seeds or tasks; reports.py)
            with locked(args.out) as out:
                checked_settings(args, sampled | knn_settings(knn))
                (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
                add_record(record, out, _eval_header(args, argv), method_order=methods)

        def save_new(record):  # a seed re-run for its pending methods scores the done ones again
            if (record.task, record.method, record.seed) not in done:
                save(record)

        if pending_seeds:  # each seed's records saved as they come: a long grid resumes seed by seed
            evaluate_task(
                classifier,
                args.data,
                task,
                frozen,
                pending_seeds,
                calibration=args.calibration,
                shots=args.shots,
                load=loader(task),
                on_record=save_new,
                cache_dir=Path(args.out) / "cache",
            )
        if pending_runs:
            evaluate_trained(
                classifier,
                args.data,
                task,
                trainable,
                sorted({s for _, s in pending_runs}, key=seeds.index),
                config,
                done=done,
                on_record=save,
                shots=args.shots,
                load=loader(task),
                out=Path(args.out) if args.keep_distributions else None,
            )
        for peer_name, pending in pending_peers.items():
            evaluate_setfit(
                classifier,
                args.data,
                task,
                pending,
                config=peers[peer_name],
                shots=args.shots,
                device=args.device,
                on_record=save,
                load=loader(task),
            )
    if classifier is None:
        print(f"every requested run is already in {args.out}; nothing to do", file=sys.stderr)
    print((Path(args.out) / "results.md").read_text())


def check_method_options(records: Sequence[EvalRecord], specs: Sequence[str], out: str) -> None:
    """ValueError if a recorded run of one of `specs` was trained with other options than the spec
    means now (a default changed since): resuming would report two configurations under one name.
    Records without `method_config` (runs from before it was recorded) cannot be checked. Every SetFit
    run in `out` is checked, asked for or not: its recorded options always say what ran, and a table
    would show a run of an older default under today's name (and the 16-shot target would read it as
    today's peer)."""
    from dataclasses import asdict

    from openbook.methods import method_config

    from research.experiments.setfit_peer import is_peer, peer_config, recorded_peer_config

    for record in records:
        if is_peer(record.method):
            recorded = recorded_peer_config(record.params)
            now = asdict(peer_config(record.method))
        elif record.method in specs and record.params.get("method_config") is not None:
            recorded = record.params["method_config"]
            now = method_config(record.method)
        else:
            continue
        if recorded != now:
            changed = ", ".join(
                f"{k}: {recorded.get(k)!r} -> {v!r}" for k, v in now.items() if recorded.get(k) != v
            )
            raise ValueError(
                f"{out} holds {record.method} runs trained with other options ({changed}); use another "
                f"--out, or `python -m research relabel {out}` to name its runs by what they ran"
            )


def _blank_texts(task: str, splits: dict[int, KShotSplits]) -> str | None:
    """A line counting the blank texts per split, or None without any. They are kept: a published
    split is scored as it is, and a blank text is still a prompt (the template alone)."""
    from openbook.data import blank_texts

    test = next(iter(splits.values())).test  # shared by every seed
    counts = {"test": 0 if test is None else blank_texts(test)}
    for seed, seed_splits in splits.items():
        counts |= {
            f"seed {seed} {part}": blank_texts(getattr(seed_splits, part)) for part in ("train", "dev")
        }
    found = [f"{split} {count}" for split, count in counts.items() if count]
    if not found:
        return None
    return f"{task}: blank texts, kept as they are (the prompt is the template alone): {', '.join(found)}"


def _eval_header(args: argparse.Namespace, argv: Sequence[str]) -> str:
    scores = (
        "Dev accuracy in % (--no-test: no test example was read), mean (std) over seeds: the final"
        " classifier's, with its kNN interpolation where the method has one. Every choice was made on"
        " these dev examples, so the figures flatter; they compare configurations, they do not"
        " estimate test accuracy. "
        if args.no_test
        else "Accuracy and macro-F1 on test in %, mean (std) over seeds; every hyper-parameter chosen"
        " on dev. "
    )
    return (
        f"# {'Full-data' if args.full else f'{args.shots}-shot'} evaluation, seeds {args.seeds},"
        f" backbone {args.backbone}"
        + (", dev only" if args.no_test else "")
        + ("" if args.test_size is None else f", test: a fixed sample of {args.test_size} examples (seed 0)")
        + "\n\n"
        + scores
        + "`seconds / run` is the wall time of one method x seed run, training included.\n\n"
        f"Command: `{PROG} {shlex.join(argv)}`\n\n"
    )


def _reader_tuning(value: str) -> dict[str, object]:
    """`--reader-tuning`'s name=value pairs, each value of its ReaderConfig field's type."""
    from openbook.sentence_reader import ReaderConfig

    defaults: dict[str, Any] = {field.name: field.default for field in dataclasses.fields(ReaderConfig)}
    tuning: dict[str, object] = {}
    for pair in filter(None, (part.strip() for part in value.split(","))):
        name, _, text = pair.partition("=")
        if name not in defaults or name == "encoder" or not text:
            fields = ", ".join(n for n in defaults if n != "encoder")
            raise argparse.ArgumentTypeError(f"{pair!r}: expected name=value with a name among {fields}")
        kind = type(defaults[name])
        try:
            tuning[name] = kind(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{pair!r}: {error}") from None
    return tuning
