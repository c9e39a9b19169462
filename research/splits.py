"""Fresh few-shot splits, drawn from the full training sets, for a dev check that needs new evidence.

The five standard 16-shot splits (seeds 13, 21, 42, 87, 100) have decided several defaults on their dev
sets. When their dev figures *suggest* a candidate, testing it on the same dev sets would reuse the
evidence that suggested it. `fresh_splits` draws new `train` and `dev` splits of `shots` examples per
label from the task's full training set, under new seeds, leaving out every text of the task's k-shot
test file and of every standard seed's dev split, so that no fresh example is one the standard splits
scored. (Their training examples may recur: trec has 86 ABBR questions in all, and the standard splits
use 78 of them.) A text that appears with two labels is left out too, and so is a blank one. A label
with fewer than 2 × `shots` examples left gives half of them to train and half to dev.

The output has the k-shot layout (`<task>/<shots>-<seed>/{train,dev}.csv`, `label,text` rows), so
`python -m research eval --no-test --data DIR` reads it; it holds no test file, and `--no-test` reads none.

A judge. Each run's dev split also chooses its kept step and lambda, so a dev score flatters every
candidate, unevenly. With `judge`, a fixed sample of that many pool examples (the same for every seed,
drawn with seed 0) is set apart before any seed draws, and written as the task's `test.csv`: then
`python -m research eval --data DIR` (with its test) scores each run on examples that chose nothing, and never
reads the task's real test set. Splits with and without a judge differ, so they need other seeds.
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Sequence, Set
from pathlib import Path

import numpy as np
from openbook.data import DataError, Example, label_set, read_full_split, read_split

# The full training set each task's fresh splits come from (in `full/`); mpqa's holds its test file's
# sentences too, which are left out with the rest of k-shot/mpqa.
POOL_FILES = {
    "SST-2": "stsa.binary.train",
    "sst-5": "stsa.fine.train",
    "trec": "TREC.train.all",
    "mpqa": "mpqa.all",
}


def text_key(text: object) -> str:
    return " ".join(str(text).lower().split())


def scored_texts(kshot_dir: str | Path, task: str) -> set[str]:
    """Every text the standard k-shot splits of `task` score: its test file and every seed's dev split,
    normalised."""
    task_dir = Path(kshot_dir) / task
    files = sorted(
        p for p in task_dir.rglob("*") if p.suffix in (".csv", ".tsv") and p.stem in ("test", "dev")
    )
    if not files:
        raise FileNotFoundError(f"no k-shot test or dev files under {task_dir}")
    return {text_key(example.text) for path in files for example in read_split(path)}


def fresh_pool(full_dir: str | Path, kshot_dir: str | Path, task: str) -> list[Example]:
    """The task's full training set without the texts its standard k-shot splits score, each text once,
    and without texts that carry two labels; in file order."""
    if task not in POOL_FILES:
        raise DataError(f"no full training set to draw {task!r} from; known: {', '.join(POOL_FILES)}")
    path = Path(full_dir) / POOL_FILES[task]
    if not path.is_file():
        raise FileNotFoundError(f"full training set not found: {path}")
    seen = scored_texts(kshot_dir, task)
    return each_text_once(read_full_split(path, skip_blank_texts=True), leave_out=seen)


def each_text_once(examples: Sequence[Example], leave_out: Set[str] = frozenset()) -> list[Example]:
    """`examples` in order, each text (`text_key`) once, the first seen, without the texts that carry two
    labels and those in `leave_out` (normalised keys)."""
    labels_of: dict[str, set[str]] = {}
    for example in examples:
        labels_of.setdefault(text_key(example.text), set()).add(example.label)
    pool, kept = [], set()
    for example in examples:
        key = text_key(example.text)
        if key not in leave_out and key not in kept and len(labels_of[key]) == 1:
            kept.add(key)
            pool.append(example)
    return pool


def draw(pool: Sequence[Example], seed: int, shots: int) -> tuple[list[Example], list[Example]]:
    """(train, dev): `shots` examples of each label for each (half of a label's examples each, if it has
    fewer than 2 × shots), disjoint, drawn with `seed`; each in a seeded shuffle."""
    rng = np.random.default_rng(seed)
    train, dev = [], []
    for label in label_set(pool):
        members = [example for example in pool if example.label == label]
        count = min(shots, len(members) // 2)
        if count < 1:
            raise DataError(f"label {label!r} has {len(members)} example(s) left: too few for train and dev")
        chosen = rng.permutation(len(members))[: 2 * count]
        train += [members[i] for i in chosen[:count]]
        dev += [members[i] for i in chosen[count:]]
    return [train[i] for i in rng.permutation(len(train))], [dev[i] for i in rng.permutation(len(dev))]


def short_labels(pool: Sequence[Example], shots: int) -> dict[str, int]:
    """The labels with fewer than 2 × `shots` examples in `pool`, and how many they have."""
    counts = {label: sum(example.label == label for example in pool) for label in label_set(pool)}
    return {label: n for label, n in counts.items() if n < 2 * shots}


def write_csv(path: Path, examples: Sequence[Example]) -> None:
    """`label,text` rows, quoted where needed, as the k-shot csv files are read (`data.read_split`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([example.label, example.text] for example in examples)


def labelled_pairs(examples: Sequence[Example]) -> list[tuple[object, str]]:
    return [(example.text, example.label) for example in examples]


def set_apart(pool: Sequence[Example], size: int) -> tuple[list[Example], list[Example]]:
    """(judge, rest): a fixed sample of `size` examples of `pool`, drawn with seed 0, in file order, and
    the pool without them."""
    if not 0 < size < len(pool):
        raise DataError(f"a judge of {size} examples needs a pool larger than that; it has {len(pool)}")
    chosen = set(np.random.default_rng(0).permutation(len(pool))[:size].tolist())
    judge = [example for i, example in enumerate(pool) if i in chosen]
    return judge, [example for i, example in enumerate(pool) if i not in chosen]


def write_fresh_splits(
    full_dir: str | Path,
    kshot_dir: str | Path,
    out: str | Path,
    task: str,
    seeds: Sequence[int],
    shots: int = 16,
    judge: int = 0,
) -> list[Path]:
    """Write `out/task/<shots>-<seed>/{train,dev}.csv` for each seed; the directories written. A seed's
    directory appears whole or not at all (written beside it, then renamed); one that exists already
    is kept if it holds the same splits, and refused otherwise. With `judge`, `out/task/test.csv` holds
    that many examples that no seed draws from (module docstring), written and checked likewise."""
    standard = {p.name for p in (Path(kshot_dir) / task).glob(f"{shots}-*")}
    reused = sorted(seed for seed in seeds if f"{shots}-{seed}" in standard)
    if reused:
        raise DataError(f"seeds {reused} name standard {task} splits; fresh splits need other seeds")
    pool = fresh_pool(full_dir, kshot_dir, task)
    judge_path = Path(out) / task / "test.csv"
    if judge:
        held_out, pool = set_apart(pool, judge)
        if judge_path.exists():
            if labelled_pairs(read_split(judge_path)) != labelled_pairs(held_out):
                raise DataError(f"{judge_path} holds another judge; give another --out")
        else:
            staging = judge_path.with_name(".test.csv.partial")
            write_csv(staging, held_out)
            staging.rename(judge_path)
    elif judge_path.exists():
        raise DataError(f"{judge_path} is a judge that these splits would not leave out; give another --out")
    return write_seeds(pool, Path(out) / task, seeds, shots)


def write_seeds(pool: Sequence[Example], task_dir: Path, seeds: Sequence[int], shots: int) -> list[Path]:
    """`task_dir/<shots>-<seed>/{train,dev}.csv` drawn from `pool` for each seed (`draw`); the
    directories written. Each appears whole or not at all (written beside it, then renamed); one that
    exists already is kept if it holds the same splits, and refused otherwise."""
    written = []
    for seed in seeds:
        directory = task_dir / f"{shots}-{seed}"
        splits = dict(zip(("train", "dev"), draw(pool, seed, shots), strict=True))
        if directory.exists():
            held = {name: labelled_pairs(read_split(directory / f"{name}.csv")) for name in splits}
            if held != {name: labelled_pairs(split) for name, split in splits.items()}:
                raise DataError(f"{directory} holds other splits; give another --out")
            continue
        staging = directory.with_name(f".{directory.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        for name, split in splits.items():
            write_csv(staging / f"{name}.csv", split)
        staging.rename(directory)
        written.append(directory)
    return written
