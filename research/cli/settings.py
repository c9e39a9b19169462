"""What a results directory records of the command that made it (`settings.json`), and the kNN scoring
options the grids take: a directory holds runs made with one set of settings, and resuming it with
others is an error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from openbook.cli.common import prompt_for, task_dir, train_config
from openbook.word_scores import resolve_label_scoring

if TYPE_CHECKING:
    from openbook.knn import KnnConfig


def add_knn_arguments(parser: argparse.ArgumentParser) -> None:
    """How the store's neighbours are scored (knn.KnnConfig); the defaults are KnnConfig's."""
    from openbook.knn import SIMILARITIES, KnnConfig

    default = KnnConfig()
    group = parser.add_argument_group("kNN scoring (knn.py)")
    group.add_argument(
        "--knn-similarity",
        choices=SIMILARITIES,
        default=default.similarity,
        help="cosine, or centred: cosine after subtracting the store's mean key",
    )
    group.add_argument(
        "--knn-standardise",
        action=argparse.BooleanOptionalAction,
        default=default.standardise,
        help="divide the temperature by the spread (std) of each query's k similarities",
    )
    group.add_argument(
        "--knn-temperature",
        type=float,
        default=default.temperature,
        help="T of knn-interp (knn chooses T from its grid)",
    )


def knn_config(args: argparse.Namespace) -> KnnConfig:
    from openbook.knn import KnnConfig

    return KnnConfig(
        temperature=args.knn_temperature, similarity=args.knn_similarity, standardise=args.knn_standardise
    )


def knn_settings(knn: KnnConfig) -> dict:
    """How neighbours were scored, as `settings.json` records it."""
    return {
        "knn": {"similarity": knn.similarity, "standardise": knn.standardise, "temperature": knn.temperature}
    }


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


# Settings a results directory records only when they differ from these, so that directories made before
# each existed still resume; a directory that does not name one ran with this value.
UNRECORDED_SETTINGS: dict[str, object] = {
    "full": None,
    "full_dev_size": None,
    "train_precision": "float32",
    "keep": "best",
}


def checked_settings(args: argparse.Namespace, extra: dict | None = None) -> dict:
    """A results directory holds runs made with one set of settings; resuming with others is an error."""
    keys = (
        "data backbone template labels layer max_length batch_size device shots calibration "
        "steps train_batch_size lr eval_every patience reembed_every"
    ).split()
    settings = {key: getattr(args, key) for key in keys}
    # The budget with its defaults spelled out: a step count and eval_every, or epochs and the cap
    # (eval_every None: a dev check every epoch).
    settings |= train_config(args, seed=0).budget()
    if getattr(args, "full", False):  # `eval --full` only (continual shares this)
        settings |= {"full": True, "full_dev_size": args.full_dev_size}
    if hasattr(args, "label_scoring"):  # the commands that build their classifier from the arguments
        settings["label_scoring"] = recorded_label_scoring(args)
    settings |= {"train_precision": args.train_precision, "keep": args.keep}
    settings = {k: v for k, v in settings.items() if UNRECORDED_SETTINGS.get(k, ...) != v}  # see above
    settings |= extra or {}
    path = Path(args.out) / "settings.json"
    if path.exists():
        saved = json.loads(path.read_text())

        def ran(recorded: dict, key: str) -> object:
            return recorded.get(key, UNRECORDED_SETTINGS.get(key))

        # Compared both ways: a directory of --keep last runs is not resumed without --keep either.
        keys = [*settings, *(key for key in UNRECORDED_SETTINGS if key in saved and key not in settings)]
        changed = {
            k: (ran(saved, k), ran(settings, k))
            for k in keys
            if ran(saved, k) != ran(settings, k) and k not in ("device", "batch_size")
        }
        if changed:
            details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ValueError(
                f"{args.out} holds results made with other settings ({details}); use another --out"
            )
    return settings
