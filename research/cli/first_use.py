"""`python -m research first-use`: how an untrained task classifies from its first examples, per
calibration (dev)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from openbook.cli.common import (
    add_data_argument,
    add_label_scoring_argument,
    add_prompt_arguments,
    classifier_from_args,
)

from research import PROG


def add_parser(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "first-use",
        help="dev accuracy of an untrained task holding a few examples per class, per calibration and λ",
        description="Draws a few examples per class from each seed's 16-shot training split into the store "
        "and scores the seed's dev split as an untrained service task would (the default k and T), with "
        "the content-free and the domain calibration, and λ = 0.5 or chosen on the stored examples, each "
        "scored leave-one-out. Test files are never read.",
    )
    add_data_argument(check, "k-shot", "directory in the k-shot layout")
    check.add_argument("--task", default="SST-2,trec,mpqa,sst-5", help="tasks, separated by commas")
    check.add_argument("--seeds", default="13,21,42,87,100")
    check.add_argument("--per-class", default="1,2,4,8", help="examples per class in the store, e.g. 1,2,4,8")
    check.add_argument("--out", required=True, help="directory for results.json and results.md")
    check.add_argument(
        "--probes",
        action="store_true",
        help="instead: a fresh sentiment task probed with near-paraphrases and plain probes "
        "(research.experiments.first_use_probes), its answers added to OUT/probes.json per --backbone",
    )
    check.add_argument("--reader", help="the task's sentence reader (e.g. mpnet): P_kNN reads its neighbours")
    add_prompt_arguments(check)
    add_label_scoring_argument(check)


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.atomic import write_text
    from openbook.data import load_train_dev
    from tqdm import tqdm

    from research.experiments.first_use import check_seed, first_use_table

    if args.probes:
        return _probes(args, argv)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    per_class = [int(n) for n in args.per_class.split(",")]
    if min(per_class) < 1:
        raise ValueError(f"--per-class counts must be at least 1, got {args.per_class}")
    data = {(t, s): load_train_dev(args.data, t, s) for t in tasks for s in seeds}  # all checked up front
    records = []
    for task in tasks:
        classifier = classifier_from_args(args, task, reader=args.reader)
        for seed in tqdm(seeds, desc=f"{task} seeds"):
            records += check_seed(classifier, task, seed, *data[task, seed], per_class)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "results.json", json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")
    table = (
        f"# First use: an untrained task with a few examples per class, backbone {args.backbone}"
        + (f", reader {args.reader}" if args.reader else "")
        + f", seeds {args.seeds}\n\n"
        "Dev accuracy in %, mean over seeds, of the prediction an untrained task serves "
        "(P_LM alone / P_kNN alone in brackets).\n\n"
        f"Command: `{PROG} {shlex.join(argv)}`\n\n" + first_use_table(records)
    )
    write_text(out / "results.md", table)
    print(table)


def _probes(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook.atomic import add_json_record
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.sentence_reader import untuned_reader

    from research.experiments.first_use_probes import fresh_task, probe

    backbone = load_backbone(BackboneConfig(name=args.backbone, device=args.device))
    reader = None if args.reader is None else untuned_reader(args.reader, str(backbone.device))
    classifier, ids = fresh_task(backbone, reader)
    record = {
        "command": f"{PROG} {shlex.join(argv)}",
        "backbone": args.backbone,
        **({"reader": args.reader} if args.reader else {}),
        **probe(classifier, ids),
    }
    # one record per backbone and reader: a run again replaces its own
    add_json_record(
        Path(args.out) / "probes.json",
        record,
        lambda old: (old["backbone"], old.get("reader")) == (args.backbone, args.reader),
    )
    name = args.backbone + (f" + {args.reader}" if args.reader else "")
    print(
        f"{name}: {record['paraphrases_known']} of {len(record['paraphrases'])} paraphrases known, "
        f"{record['probes_right']} of {len(record['probes'])} plain probes right (λ {record['lam']})"
    )
