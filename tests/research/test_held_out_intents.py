"""`research/held_out_intents.py`: some of a many-label task's own labels held out as its out-of-scope
queries, a judge of the rest set apart, new seeds drawn from what is left; read back by the loader."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from openbook.data import DataError, load_kshot
from openbook.prompting.presets import get_preset

from research.cli import main
from research.held_out_intents import OUT_OF_SCOPE_LABEL, hold_out, standard_pool

LABELS = [str(i) for i in range(6)]


def _standard(root: Path) -> Path:
    """A clinc150-like k-shot task: 6 intents, seeds 13 and 21 of 4 train and 4 dev texts each, partly
    overlapping (seed 21 repeats seed 13's dev as its train), one text under two labels."""
    task = root / "k-shot" / "clinc150"
    (task / "labels.txt").parent.mkdir(parents=True)
    (task / "labels.txt").write_text("".join(f"{label}=intent {label}\n" for label in LABELS))
    rows = {
        (seed, split): [(label, f"{label} {seed} {split} {i}") for label in LABELS for i in range(4)]
        for seed in (13, 21)
        for split in ("train", "dev")
    }
    rows[(21, "train")] = rows[(13, "dev")]  # the same texts again: kept once
    rows[(21, "dev")][0] = ("1", rows[(13, "train")][0][1])  # labelled 0 in seed 13: left out
    for (seed, split), examples in rows.items():
        (task / f"4-{seed}").mkdir(exist_ok=True)
        with open(task / f"4-{seed}" / f"{split}.csv", "w", newline="") as handle:
            csv.writer(handle).writerows(examples)
    return root / "k-shot"


def test_the_pool_is_every_standard_text_once_and_none_with_two_labels(tmp_path: Path) -> None:
    pool = standard_pool(_standard(tmp_path), "clinc150")
    texts = [example.text for example in pool]
    # three distinct files of 24, less seed 21's dev text that was replaced and the text under two labels
    assert len(texts) == len(set(texts)) == 6 * 4 * 3 - 2
    assert "0 13 train 0" not in texts


def test_held_out_labels_become_out_of_scope_and_the_judge_is_apart_from_the_rest(tmp_path: Path) -> None:
    pool = standard_pool(_standard(tmp_path), "clinc150")
    kept, inside, outside, rest = hold_out(pool, LABELS, 2, judge=3)
    assert len(kept) == 4 and set(kept) < set(LABELS)
    held = set(LABELS) - set(kept)
    assert {e.label for e in outside} == {OUT_OF_SCOPE_LABEL}
    assert {e.text for e in outside} == {e.text for e in pool if e.label in held}
    assert {e.label for e in inside} == set(kept) and len(inside) == 3 * len(kept)
    assert {e.label for e in rest} == set(kept)
    assert not {e.text for e in inside} & {e.text for e in rest}  # the judge chose nothing
    assert hold_out(pool, LABELS, 2, judge=3)[0] == kept  # drawn with seed 0
    with pytest.raises(DataError, match="hold out between 1 and 5"):
        hold_out(pool, LABELS, 6, judge=3)


def test_the_command_writes_a_task_that_eval_reads_and_refuses_a_standard_seed(
    tmp_path: Path, capsys
) -> None:
    kshot = _standard(tmp_path)
    out = tmp_path / "judge"
    args = ["held-out-intents", "--data", str(tmp_path), "--seeds", "5,6", "--shots", "2", "--hold-out", "2"]
    assert main([*args, "--judge", "3", "--out", str(out)]) == 0
    assert "2 of 2 seeds written" in capsys.readouterr().out
    splits = load_kshot(out, "clinc150", 5, shots=2)
    _, verbalizer = get_preset("clinc150").prompt("causal", out / "clinc150")
    assert len(verbalizer.labels) == 4 and {e.label for e in splits.train} == set(verbalizer.labels)
    assert len(splits.train) == len(splits.dev) == 8 and len(splits.test) == 12
    assert splits.out_of_scope and {e.label for e in splits.out_of_scope} == {OUT_OF_SCOPE_LABEL}
    assert not {e.text for e in splits.train} & {e.text for e in splits.test}
    assert main([*args, "--judge", "3", "--out", str(out)]) == 0  # again: the same, kept
    assert "0 of 2 seeds written" in capsys.readouterr().out
    assert main([*args, "--judge", "2", "--out", str(out)]) == 2  # another judge: refused, nothing written
    assert "test.csv holds another judge" in capsys.readouterr().err
    assert len(load_kshot(out, "clinc150", 5, shots=2).test) == 12
    standard = [
        "held-out-intents",
        "--data",
        str(tmp_path),
        "--seeds",
        "13",
        "--shots",
        "4",
        "--out",
        str(out),
    ]
    assert main(standard) == 2
    assert "seeds [13] name standard clinc150 splits" in capsys.readouterr().err
    assert not (out / "clinc150" / "4-13").exists() and (kshot / "clinc150" / "4-13").is_dir()
