"""`openbook continual`: a class-incremental sequence of k-shot tasks (see `continual.py`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from openbook.cli import _train_config
from openbook.cli_eval import _checked_settings
from openbook.prompting import Template
from openbook.reports import locked


def run_continual(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from openbook import continual
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.methods import build_method

    stages = continual.build_stages(
        [t.strip() for t in args.stages.split(",") if t.strip()], continual.parse_stage_words(args.labels)
    )
    specs = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    for spec in specs:
        build_method(spec)  # unknown methods and unreadable data fail before any model is loaded
    for seed in seeds:
        continual.load_stage_data(args.data, stages, seed, args.shots, args.test_size)
    settings = _checked_settings(args) | {"stages": [s.task for s in stages], "test_size": args.test_size}
    records = continual.read_continual_results(args.out)
    if any(r.stages != settings["stages"] or r.test_size != args.test_size for r in records):
        raise ValueError(f"{args.out} holds runs over other stages or test sizes; use another --out")
    header = (
        f"# Continual learning, {' -> '.join(settings['stages'])}\n\n"
        "Average accuracy and forgetting in %, mean (std) over seeds.\n\n"
        f"Command: `openbook {shlex.join(argv)}`\n\n"
    )

    def save(record: continual.ContinualRecord) -> None:
        with locked(args.out):  # other processes may share --out, running other methods or seeds
            continual.add_continual_record(record, args.out, header)
            (Path(args.out) / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")

    backbone = load_backbone(
        BackboneConfig(name=args.backbone, layer=args.layer, max_length=args.max_length, device=args.device)
    )
    continual.run_continual(
        backbone,
        args.data,
        stages,
        specs,
        seeds,
        dataclasses.replace(_train_config(args, seeds[0]), calibration=args.calibration),
        template=Template(args.template or continual.DEFAULT_TEMPLATE),
        shots=args.shots,
        test_size=args.test_size,
        batch_size=args.batch_size,
        done={(r.method, r.seed) for r in records},
        on_record=save,
    )
    print(continual.continual_table(continual.read_continual_results(args.out)))
