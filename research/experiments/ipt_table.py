"""Build IPT's pretrained prompt table from the full training sets of the standard benchmarks.

The shell around `openbook.methods.ipt.pretrain_prompt_table`: it reads the
categorised corpus (one category per task, each with the task's preset prompt
for the backbone), trains the table and saves it in the model cache, where
`ipt/strategy=pretrained` finds it:

    python -m research ipt-table --data $OPENBOOK_DATA --method ipt/strategy=pretrained

The corpus is the method's `corpus` option, task names joined by `+`. Each task
contributes a fixed random sample of `--per-task` lines of its full training
file (seeded), minus every text that appears in any k-shot split (train, dev or
test, all seeds) of these tasks: MPQA has no official split, so its full file
contains the k-shot test set, and dropping the k-shot dev texts keeps model
selection on dev honest. A table built with the evaluated task in the corpus
has still seen thousands of that task's labelled examples: leave the task out
(e.g. `corpus=trec+mpqa+sst-5` for SST-2) when the numbers must be k-shot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from openbook.backbone import Backbone
from openbook.methods.ipt import LabelledCorpus
from openbook.prompting import TextInput, get_preset

FULL_TRAIN_FILES = {
    "sst-2": "stsa.binary.train",
    "sst-5": "stsa.fine.train",
    "trec": "TREC.train.all",
    "mpqa": "mpqa.all",  # no split: its k-shot test texts are dropped (see `kshot_texts`)
}


def _normalise(text: TextInput) -> str:
    return " ".join((text if isinstance(text, str) else " ".join(text)).lower().split())


def kshot_texts(datasets_dir: Path) -> set[str]:
    """Every text of every k-shot split (train, dev and test of every seed) of the corpus tasks."""
    from openbook.data import read_split

    held_out: set[str] = set()
    for task_dir in (datasets_dir / "k-shot").iterdir():
        if task_dir.name.lower() in FULL_TRAIN_FILES:
            for path in [*task_dir.glob("*.[ct]sv"), *task_dir.glob("*/*.[ct]sv")]:
                held_out.update(_normalise(example.text) for example in read_split(path))
    return held_out


def read_full_corpus(
    datasets_dir: Path, task: str, backbone: Backbone, *, per_task: int, seed: int, held_out: set[str]
) -> LabelledCorpus:
    """A fixed random `per_task` lines of the task's full train file (`label text` per line), minus the
    `held_out` texts, with the task's preset prompt for this backbone."""
    path = datasets_dir / "full" / FULL_TRAIN_FILES[task]
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()  # a few lines are Latin-1
    pairs = [(label, text.strip()) for label, _, text in (line.partition(" ") for line in lines)]
    kept = [(label, text) for label, text in pairs if text and _normalise(text) not in held_out]
    rows = np.sort(np.random.default_rng(seed).permutation(len(kept))[:per_task])
    template, verbalizer = get_preset(task).prompt(backbone.kind)
    texts = [kept[i][1] for i in rows]
    labels = np.array([verbalizer.index(kept[i][0]) for i in rows], dtype=np.int64)
    return LabelledCorpus(task, template, verbalizer, texts, labels)
