"""Held-out intents: a judge of out-of-scope refusal that reads no out-of-scope query
(docs/experiments/two-readers.md, "Refusing out-of-scope queries by the reader's neighbours").

A refusal rule must be chosen without the task's out-of-scope test queries, yet it needs queries that
fit none of the labels. So some of the task's own intents leave it: from the union of clinc150's
standard splits (the train and dev files of its five seeds, each text once, none with two labels),
`hold_out` intents drawn with seed 0 become out of scope, their examples the judge's out-of-scope
queries (`oos_test.csv`, label -1). Of every other intent, `judge` examples, drawn with seed 0, are the
judge's in-scope queries (`test.csv`); new seeds draw their `train` and `dev` splits from what is left
(`splits.draw`). `labels.txt` lists the kept intents, as the task's own names them.

The output has the k-shot layout, so `python -m research eval --data OUT --task clinc150 --shots 10`
runs as on the standard splits, reads its out-of-scope recall off the held-out intents, and never opens
the real test files. A seed's directory is written whole or not at all, and one already there is kept
only if it holds the same splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from openbook.data import DataError, Example, read_split

from research.splits import each_text_once, labelled_pairs, write_csv, write_seeds

OUT_OF_SCOPE_LABEL = "-1"  # the label of an out-of-scope query in the k-shot layout


def standard_pool(kshot_dir: str | Path, task: str) -> list[Example]:
    """Every example of the task's standard seeds' train and dev files, each text once (the first seen,
    seeds in name order), without texts that carry two labels."""
    files = sorted((Path(kshot_dir) / task).glob("*-*/*.csv"))
    files = [path for path in files if path.stem in ("train", "dev")]
    if not files:
        raise FileNotFoundError(f"no k-shot train or dev files under {Path(kshot_dir) / task}")
    return each_text_once([example for path in files for example in read_split(path)])


def hold_out(
    pool: Sequence[Example], labels: Sequence[str], count: int, judge: int
) -> tuple[list[str], list[Example], list[Example], list[Example]]:
    """(kept labels, in-scope judge, out-of-scope judge, the rest): `count` of `labels` drawn with seed 0
    leave the task, their examples relabelled out of scope; `judge` examples of each kept label, drawn
    with seed 0, set apart; each list in pool order."""
    if not 0 < count < len(labels):
        raise DataError(f"hold out between 1 and {len(labels) - 1} of the {len(labels)} labels, not {count}")
    rng = np.random.default_rng(0)
    held = {labels[i] for i in rng.permutation(len(labels))[:count].tolist()}
    kept = [label for label in labels if label not in held]
    judged: set[int] = set()
    for label in kept:
        members = [i for i, example in enumerate(pool) if example.label == label]
        if len(members) <= judge:
            raise DataError(
                f"label {label!r} has {len(members)} examples: none left beside a judge of {judge}"
            )
        judged.update(members[i] for i in rng.permutation(len(members))[:judge].tolist())
    inside = [example for i, example in enumerate(pool) if i in judged]
    outside = [
        Example(example.text, OUT_OF_SCOPE_LABEL, example.source) for example in pool if example.label in held
    ]
    rest = [example for i, example in enumerate(pool) if example.label in kept and i not in judged]
    return kept, inside, outside, rest


def write_held_out_intents(
    kshot_dir: str | Path,
    out: str | Path,
    task: str,
    seeds: Sequence[int],
    *,
    shots: int = 10,
    count: int = 30,
    judge: int = 20,
) -> list[Path]:
    """Write `out/task/` (module docstring) for each seed; the seed directories written."""
    source = Path(kshot_dir) / task
    standard = {p.name for p in source.glob(f"{shots}-*")}
    reused = sorted(seed for seed in seeds if f"{shots}-{seed}" in standard)
    if reused:
        raise DataError(f"seeds {reused} name standard {task} splits; a judge needs other seeds")
    names = dict(line.split("=", 1) for line in (source / "labels.txt").read_text().splitlines() if line)
    kept, inside, outside, rest = hold_out(standard_pool(kshot_dir, task), list(names), count, judge)
    task_dir = Path(out) / task
    shared: dict[str, str | Sequence[Example]] = {
        "labels.txt": "".join(f"{label}={names[label]}\n" for label in kept),
        "test.csv": inside,
        "oos_test.csv": outside,
    }
    for name, content in shared.items():
        _write_once(task_dir / name, content)
    return write_seeds(rest, task_dir, seeds, shots)


def _write_once(path: Path, content: str | Sequence[Example]) -> None:
    """Write `path` (beside it, then renamed), or check that it already holds `content`."""
    if isinstance(content, str):
        if path.exists():
            if path.read_text() != content:
                raise DataError(f"{path} holds another judge; give another --out")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.partial")
        staging.write_text(content)
        staging.rename(path)
        return
    if path.exists():
        if labelled_pairs(read_split(path)) != labelled_pairs(content):
            raise DataError(f"{path} holds another judge; give another --out")
        return
    staging = path.with_name(f".{path.name}.partial")
    write_csv(staging, content)
    staging.rename(path)
