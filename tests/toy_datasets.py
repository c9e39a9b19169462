"""Small tasks in the k-shot layout, written on demand for the CLI and harness tests (the `toy_dataset`
fixture of conftest.py hands one out)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np


class ToyDatasets:
    """Writes small tasks in the k-shot layout (csv rows `label,"text"`) for the CLI and harness tests.

    Calling it writes the sentiment task `toy`; `two_stages` adds the question-type task `qs` after it.
    """

    positive = ("the movie was great and fun", "a good film with a great cast", "great fun", "a good film")
    negative = (
        "it was terrible and boring",
        "a bad film , it was awful",
        "boring and bad",
        "a terrible film",
    )
    questions: ClassVar[dict[str, tuple[str, ...]]] = {
        "0": ("what is the answer", "what is this question", "what is the book"),
        "1": ("who wrote the book", "who is it", "who wrote this"),
        "2": ("where is the city", "where is the river", "where is the light"),
    }
    # The continual stages' label words, as `python -m research continual --labels` takes them.
    stage_labels = "toy:0=bad,toy:1=good,qs:0=what,qs:1=who,qs:2=where"

    @staticmethod
    def write_csv(path: Path, rows: Sequence[tuple[str, str]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f'{label},"{text}"\n' for label, text in rows))

    def __call__(self, root: Path, seeds: Sequence[int] = (1, 2), task: str = "toy") -> Path:
        """8 training sentences per seed (dev: the same, reversed) and 10 shared test sentences."""
        rows = [("1", t) for t in self.positive] + [("0", t) for t in self.negative]
        for seed in seeds:
            rng = np.random.default_rng(seed)
            order = rng.permutation(len(rows))
            self.write_csv(root / task / f"16-{seed}" / "train.csv", [rows[i] for i in order])
            self.write_csv(root / task / f"16-{seed}" / "dev.csv", [rows[i] for i in order[::-1]])
        self.write_csv(root / task / "test.csv", [*rows, ("1", "fun and good"), ("0", "awful and boring")])
        return root

    def two_stages(self, root: Path) -> Path:
        """`toy` (sentiment, 2 labels) then `qs` (question type, 3 labels), in the k-shot layout, seed 1."""
        self(root, seeds=(1,))
        rows = [(label, text) for label, texts in self.questions.items() for text in texts]
        self.write_csv(root / "qs" / "16-1" / "train.csv", rows)
        self.write_csv(root / "qs" / "16-1" / "dev.csv", rows[::-1])
        self.write_csv(
            root / "qs" / "test.csv", [*rows, ("2", "where is the book"), ("1", "who is the cast")]
        )
        return root
