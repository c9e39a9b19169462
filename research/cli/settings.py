"""What a results directory records of the command that made it (`settings.json`), and the kNN scoring
options the grids take: a directory holds runs made with one set of settings, and resuming it with
others is an error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from openbook.cli.common import prompt_for, task_dir, train_config
from openbook.config_fields import add_field_arguments, field_values
from openbook.knn import KnnConfig
from openbook.word_scores import resolve_label_scoring

# How the store's neighbours are scored: KnnConfig's fields, as --knn-<field>.
KNN_FIELDS = ("similarity", "standardise", "temperature")
KNN_FLAGS = {name: f"knn-{name}" for name in KNN_FIELDS}


def add_knn_arguments(parser: argparse.ArgumentParser) -> None:
    """How the store's neighbours are scored (knn.KnnConfig), defaults and help KnnConfig's."""
    add_field_arguments(
        parser.add_argument_group("kNN scoring (knn.py)"), KnnConfig, KNN_FIELDS, flags=KNN_FLAGS
    )


def knn_config(args: argparse.Namespace) -> KnnConfig:
    return KnnConfig(**field_values(args, KNN_FIELDS, flags=KNN_FLAGS))


def knn_settings(knn: KnnConfig) -> dict:
    """How neighbours were scored, as `settings.json` records it."""
    return {"knn": {name: getattr(knn, name) for name in KNN_FIELDS}}


def recorded_label_scoring(args: argparse.Namespace) -> str:
    """The label scoring a results directory records: "auto" resolved, where every task of the run
    resolves alike (so a directory of exact-scored runs resumes under the default), else "auto"."""
    if args.label_scoring != "auto":
        return str(args.label_scoring)
    tasks: list[str | None] = [t.strip() for t in (getattr(args, "task", None) or "").split(",") if t.strip()]
    counts = {
        len(prompt_for(task, args.template, args.labels, "causal", task_dir(args, task))[1].labels)
        for task in tasks or [None]
    }
    resolved = {resolve_label_scoring("auto", count) for count in counts}
    return resolved.pop() if len(resolved) == 1 else "auto"


def checked_settings(args: argparse.Namespace, extra: dict | None = None) -> dict:
    """A results directory holds runs made with one set of settings; resuming with others is an error.
    Every setting is recorded, so a directory that lacks one (made before it existed) does not resume."""
    keys = (
        "data backbone template labels layer max_length batch_size device shots calibration "
        "steps train_batch_size lr eval_every patience reembed_every"
    ).split()
    settings = {key: getattr(args, key) for key in keys}
    # The budget with its defaults spelled out: a step count and eval_every, or epochs and the cap
    # (eval_every None: a dev check every epoch).
    settings |= train_config(args, seed=0).budget()
    full = bool(getattr(args, "full", False))  # `eval --full` only (continual shares this)
    settings |= {"full": full, "full_dev_size": args.full_dev_size if full else None}
    if hasattr(args, "label_scoring"):  # the commands that build their classifier from the arguments
        settings["label_scoring"] = recorded_label_scoring(args)
    settings |= {"train_precision": args.train_precision, "keep": args.keep}
    settings |= extra or {}
    path = Path(args.out) / "settings.json"
    if path.exists():
        saved = json.loads(path.read_text())
        changed = [
            f"{k}: {saved[k]!r} -> {v!r}" if k in saved else f"{k}: not recorded -> {v!r}"
            for k, v in settings.items()
            if (k not in saved or saved[k] != v) and k not in ("device", "batch_size")
        ]
        if changed:
            details = ", ".join(changed)
            raise ValueError(
                f"{args.out} holds results made with other settings ({details}); use another --out"
            )
    return settings
