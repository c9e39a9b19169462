"""`python -m research two-readers`: the two readers' dev probes (docs/experiments/two-readers.md).

Runs (task, seed, n per class, variant) not yet in `--out`/runs.jsonl, appending each record as it
lands, so a grid stopped anywhere resumes; `--read` prints the probes' rules read on the records."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from openbook.cli.common import add_data_argument

RECORDS = "runs.jsonl"


def add_parser(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser(
        "two-readers",
        help="dev probes of a sentence encoder as the book's second reader, and of mixing it with the prompt",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    add_data_argument(probe, "k-shot", "directory in the k-shot layout")
    probe.add_argument("--tasks", default="SST-2,trec,mpqa,sst-5", help="tasks, separated by commas")
    probe.add_argument("--seeds", default="13,21,42,87,100")
    probe.add_argument("--shots", default="4,16", help="examples per class, separated by commas")
    probe.add_argument(
        "--variants", default="t2:2,t4:4", help="tunings name:top_layers[:steps[:lr]], separated by commas"
    )
    probe.add_argument("--backbone", default="gemma3-270m", help="the prompt's language model")
    probe.add_argument("--threads", type=int, default=1, help="torch threads")
    probe.add_argument("--out", help="directory of runs.jsonl (the probes; not with --judge)")
    probe.add_argument("--read", action="store_true", help="print the rules' readings only; run nothing")
    probe.add_argument(
        "--kept",
        metavar="DIR",
        help="with --read on probe 4's records: probe 3's directory, whose kept reader t12 is read against",
    )
    probe.add_argument(
        "--combine",
        metavar="DIR",
        help="run nothing: read the rule on how the readers combine on a readers grid's distributions/",
    )
    probe.add_argument(
        "--refusal",
        metavar="DIR",
        help="run nothing: read the refusal rule on the held-out-intents judge's records (DIR/results.json)",
    )
    probe.add_argument(
        "--judge",
        metavar="DIR",
        help="run nothing: read the default's rule on a readers judge grid's records (DIR/results.json)",
    )
    probe.add_argument(
        "--against",
        metavar="DIR",
        help="with --judge: also its two readers against those of another judge grid on the same splits"
        " (DIR/results.json; probe 8's criterion 2)",
    )


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(path: Path, record: dict) -> None:
    """One record appended under an exclusive lock: processes that split a grid's tasks share one file."""
    import fcntl

    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record) + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)


def _read_combine(directory: Path) -> None:
    from research.experiments.combining import combine_table
    from research.experiments.distributions import read_distributions

    read = combine_table(read_distributions(directory))
    tasks = read["tasks"]
    print(f"{read['runs']} runs; test (judge) accuracy in %, mean over each task's seeds")
    print("| combination | " + " | ".join(tasks) + " | mean | mean λ |")
    print("|---" * (len(tasks) + 3) + "|")
    for name, row in read["table"].items():
        cells = " | ".join(f"{row[t]:.1f}" for t in tasks)
        print(f"| {name} | {cells} | {row['mean']:.1f} | {row['mean_lam']:.2f} |")
    for name, verdict in read["verdicts"].items():
        print(
            f"{name}: {verdict['gain']:+.2f} on the mean (+1 asked), worst task {verdict['worst_task']:+.2f}"
            f" (-1 allowed): {'replaces linear' if verdict['replaces'] else 'does not replace linear'}"
        )
    print("chosen:", read["chosen"])


def _read_probes_3_and_4(records: list[dict], kept: Path | None) -> None:
    from research.experiments.reader_rules import (
        PROBE6_VARIANTS,
        PROBE7_VARIANTS,
        probe3_choice,
        probe4_reading,
        probe5_reading,
        probe6_choice,
        probe7_choice,
    )

    variants = {r["variant"] for r in records}
    if {"t4", "t6", "t6s"} <= variants:
        third = probe3_choice(records)
        print("probe 3:", json.dumps(third))
        if third["chosen"] + "b" in variants:
            print("probe 5:", json.dumps(probe5_reading(records, third["chosen"])))
    if {"t4b", *PROBE6_VARIANTS} <= variants:
        print("probe 6:", json.dumps(probe6_choice(records)))
    if {"t4b", *PROBE7_VARIANTS} <= variants:
        print("probe 7:", json.dumps(probe7_choice(records)))
    if "t12" in variants and kept is not None:
        third = probe3_choice(_records(kept / RECORDS))
        kept_mean = third["variants"][third["chosen"]]["mean"]
        print(
            f"probe 4 (against probe 3's {third['chosen']}):", json.dumps(probe4_reading(records, kept_mean))
        )


def _read(records: list[dict]) -> None:
    from research.experiments.reader_rules import probe1_choice, probe2_choice, variant_table

    print("variant shots runs | lm frozen_knn knn logreg | tune_s median")
    for row in variant_table(records):
        print(
            f"{row['variant']:7} {row['shots']:5} {row['runs']:4} | {row['lm']:.1f} {row['frozen_knn']:.1f} "
            f"{row['knn']:.1f} {row['logreg']:.1f} | {row['tune_s_median']:.0f}"
        )
    if not {"t2", "t4"} <= {r["variant"] for r in records}:
        return  # probe 3's or probe 4's records: their rules are read apart
    choice = probe1_choice(records)
    print("probe 1:", json.dumps(choice))
    second = probe2_choice(records, choice["chosen"])
    print("probe 2 (reader, n0) -> mean dev accuracy:")
    for (reader, n0), row in second["table"].items():
        cells = " ".join(
            f"{task}/{shots}:{score:.1f}" for (task, shots), score in sorted(row["cells"].items())
        )
        print(f"  {reader:6} n0={n0:<4} {row['mean']:.1f} | {cells}")
    print(
        f"probe 2: best {second['best']}, best single {second['best_single']}, gain {second['gain']:+.2f}, "
        f"worst cell {second['worst_cell']:+.2f}, adopted {second['adopted']}"
    )


def _read_judge(directory: Path) -> None:
    from research.experiments.reader_rules import judge_table

    read = judge_table(json.loads((directory / "results.json").read_text()))
    tasks = read["tasks"]
    print(f"{read['runs']} runs; judge accuracy in %, mean over each task's seeds")
    print("| reading | " + " | ".join(tasks) + " | mean |")
    print("|---" * (len(tasks) + 2) + "|")
    for column, row in read["table"].items():
        print(f"| {column} | " + " | ".join(f"{row[t]:.1f}" for t in tasks) + f" | {row['mean']:.1f} |")
    for name, verdict in read["verdicts"].items():
        print(
            f"{name}: {verdict['gain']:+.2f} on the mean (+2 asked), worst task {verdict['worst_task']:+.2f}"
            f" (-1 allowed): criteria 1 and 2 {'met' if verdict['criteria_1_and_2'] else 'missed'}"
        )


def _read_against(directory: Path, incumbent: Path) -> None:
    from research.experiments.reader_rules import probe8_reading

    read = probe8_reading(
        json.loads((directory / "results.json").read_text()),
        json.loads((incumbent / "results.json").read_text()),
    )
    tasks = read["tasks"]
    print(f"\ntwo readers, {directory.name} against {incumbent.name}, on the {read['runs']} runs both hold")
    print("| grid | " + " | ".join(tasks) + " | mean |")
    print("|---" * (len(tasks) + 2) + "|")
    for name, grid in (("candidate", directory.name), ("incumbent", incumbent.name)):
        row = read["table"][name]
        print(f"| {grid} | " + " | ".join(f"{row[t]:.1f}" for t in tasks) + f" | {row['mean']:.1f} |")
    print(
        f"{read['gain']:+.2f} on the mean (+0.5 asked), worst task {read['worst_task']:+.2f} (-1.0 allowed):"
        f" {'a better option' if read['better_option'] else 'not better'}"
    )


def _read_refusal(directory: Path) -> None:
    from research.experiments.refusal import refusal_choice

    read = refusal_choice(json.loads((directory / "results.json").read_text()))
    print(f"{read['runs']} runs; out-of-scope recall in % at the threshold chosen on in-scope dev")
    print("| score | mean recall | per run | in-scope points it cost (mean) |\n|---|---|---|---|")
    for name, row in read["scores"].items():
        runs = ", ".join(f"{r:.1f}" for r in row["recalls"])
        print(f"| {name} | {row['mean_recall']:.1f} | {runs} | {row['mean_cost']:.1f} |")
    print("chosen:", read["chosen"])


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    if args.refusal:
        _read_refusal(Path(args.refusal))
        return
    if args.against and not args.judge:
        raise ValueError("--against reads with --judge")
    if args.judge:
        _read_judge(Path(args.judge))
        if args.against:
            _read_against(Path(args.judge), Path(args.against))
        return
    if args.combine:
        _read_combine(Path(args.combine))
        return
    if not args.out:
        raise ValueError("--out is required (unless --judge)")
    out = Path(args.out)
    records_path = out / RECORDS
    if args.read:
        _read(_records(records_path))
        _read_probes_3_and_4(_records(records_path), Path(args.kept) if args.kept else None)
        return
    import numpy as np
    import torch
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.data import load_train_dev
    from openbook.prompting import get_preset
    from openbook.reader_book import as_string
    from openbook.sentence_reader import ReaderConfig, SentenceReader
    from openbook.split_encoder import SharedEncoder
    from openbook.untrained import build_classifier

    from research.experiments.two_readers import Variant, probe_run

    torch.set_num_threads(args.threads)
    tasks = [t for t in args.tasks.split(",") if t]
    seeds = [int(s) for s in args.seeds.split(",")]
    shots = [int(s) for s in args.shots.split(",")]
    variants = [Variant.parse(v) for v in args.variants.split(",") if v]
    out.mkdir(parents=True, exist_ok=True)
    done = {(r["task"], r["seed"], r["shots"], r["variant"]) for r in _records(records_path)}
    backbone = load_backbone(BackboneConfig(name=args.backbone, device="cpu"))
    bases = {v.top_layers: SharedEncoder.load(ReaderConfig(top_layers=v.top_layers), "cpu") for v in variants}
    frozen = SentenceReader(next(iter(bases.values())))
    for task in tasks:
        template, verbalizer = get_preset(task).prompt(backbone.kind, Path(args.data) / task)
        classifier = build_classifier(backbone, template, verbalizer)
        labels = list(classifier.labels)
        for seed in seeds:
            todo = [(n, v) for n in shots for v in variants if (task, seed, n, v.name) not in done]
            if not todo:
                continue
            train, dev = load_train_dev(args.data, task, seed, 16)
            dev_texts = [as_string(e.text) for e in dev]
            p_lm = np.array([[p.p_lm[label] for label in labels] for p in classifier.predict(dev_texts)])
            for n, variant in todo:
                records = probe_run(
                    task=task,
                    seed=seed,
                    shots=n,
                    variant=variant,
                    labels=labels,
                    train=([as_string(e.text) for e in train], [e.label for e in train]),
                    dev=(dev_texts, [e.label for e in dev]),
                    p_lm_dev=p_lm,
                    frozen=frozen,
                    base=bases[variant.top_layers],
                )
                for record in records:  # a run's records land together: `done` reads the first
                    _append(records_path, record)
                    print(
                        f"{task} {seed} n={n} {record['variant']}: lm {record['lm']:.1f} "
                        f"frozen {record['frozen_knn']:.1f} knn {record['knn']:.1f} "
                        f"logreg {record['logreg']:.1f} ({record['tune_s']:.0f} s)",
                        flush=True,
                    )
