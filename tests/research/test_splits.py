"""Fresh few-shot splits from the full training sets (`splits.py`, `python -m research splits`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from openbook.data import DataError, load_kshot

from research.cli import main
from research.splits import draw, fresh_pool, write_fresh_splits


def _data(root: Path) -> Path:
    """A toy evaluation root for mpqa: full/mpqa.all (40 per label, a blank text, a text with two
    labels), and k-shot/mpqa with one standard seed and a test file."""
    lines = [f"{label} phrase {label} number {i}" for i in range(40) for label in "01"]
    lines += ["0 ", "0 torn both ways", "1 torn both ways"]
    (root / "full").mkdir(parents=True)
    (root / "full" / "mpqa.all").write_text("\n".join(lines) + "\n")
    kshot = root / "k-shot" / "mpqa"
    (kshot / "16-13").mkdir(parents=True)
    (kshot / "test.csv").write_text("0,phrase 0 number 0\n1,phrase 1 number 0\n")
    (kshot / "16-13" / "dev.csv").write_text("0,phrase 0 number 1\n1,phrase 1 number 1\n")
    (kshot / "16-13" / "train.csv").write_text("0,phrase 0 number 2\n1,phrase 1 number 2\n")
    return root


def test_the_pool_leaves_out_what_the_standard_splits_score_and_ambiguous_texts(tmp_path: Path) -> None:
    root = _data(tmp_path)
    texts = {example.text for example in fresh_pool(root / "full", root / "k-shot", "mpqa")}
    assert "phrase 0 number 0" not in texts and "phrase 1 number 1" not in texts  # test, standard dev
    assert "phrase 0 number 2" in texts  # a standard training example may recur
    assert "torn both ways" not in texts and "" not in texts
    assert len(texts) == 80 - 4


def test_a_draw_is_disjoint_seeded_and_halves_a_scarce_label(tmp_path: Path) -> None:
    root = _data(tmp_path)
    pool = fresh_pool(root / "full", root / "k-shot", "mpqa")
    train, dev = draw(pool, seed=1001, shots=16)
    assert [sum(e.label == label for e in train) for label in "01"] == [16, 16]
    assert not {e.text for e in train} & {e.text for e in dev} and len(dev) == 32
    assert (train, dev) == draw(pool, seed=1001, shots=16)
    assert train != draw(pool, seed=1002, shots=16)[0]
    scarce = [e for e in pool if e.label == "1"][:5] + [e for e in pool if e.label == "0"]
    train, dev = draw(scarce, seed=1001, shots=16)
    assert [sum(e.label == "1" for e in split) for split in (train, dev)] == [2, 2]
    with pytest.raises(DataError, match="too few"):
        draw(scarce[4:5] + scarce[5:], seed=1001, shots=16)


def test_splits_are_written_whole_once_and_read_by_eval(tmp_path: Path, capsys) -> None:
    root = _data(tmp_path)
    out = tmp_path / "fresh"
    args = ["splits", "--data", str(root), "--task", "mpqa", "--seeds", "1001,1002", "--out", str(out)]
    assert main(args) == 0
    assert "mpqa: 2 of 2 seeds written" in capsys.readouterr().out
    splits = load_kshot(out, "mpqa", 1001, test=False)  # the k-shot layout, no test file
    assert (len(splits.train), len(splits.dev)) == (32, 32)
    before = (out / "mpqa" / "16-1001" / "train.csv").read_text()
    assert main(args) == 0  # the same splits again: kept, nothing written
    assert "0 of 2 seeds written" in capsys.readouterr().out
    assert (out / "mpqa" / "16-1001" / "train.csv").read_text() == before
    (out / "mpqa" / "16-1002" / "dev.csv").write_text("0,something else\n")
    with pytest.raises(DataError, match="holds other splits"):
        write_fresh_splits(root / "full", root / "k-shot", out, "mpqa", [1002])
    assert main([*args[:5], "--seeds", "13", "--out", str(out)]) == 2  # a standard seed
    assert "name standard mpqa splits" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "mpqa").iterdir()) == ["16-1001", "16-1002"]  # no partial left


def test_a_judge_is_set_apart_from_every_seed_and_read_as_test(tmp_path: Path, capsys) -> None:
    root = _data(tmp_path)
    out = tmp_path / "judged"
    args = ["splits", "--data", str(root), "--task", "mpqa", "--seeds", "2001,2002", "--shots", "8"]
    assert main([*args, "--judge", "20", "--out", str(out)]) == 0
    assert "judge: 20 examples" in capsys.readouterr().out
    judged = {seed: load_kshot(out, "mpqa", seed, shots=8) for seed in (2001, 2002)}
    judge_texts = {e.text for e in judged[2001].test or []}
    assert len(judge_texts) == 20 and judged[2001].test == judged[2002].test  # one judge for every seed
    for splits in judged.values():
        assert not judge_texts & {e.text for e in splits.train + splits.dev}
    assert main([*args, "--judge", "20", "--out", str(out)]) == 0  # the same judge again: kept
    assert main([*args, "--judge", "10", "--out", str(out)]) == 2
    assert "holds another judge" in capsys.readouterr().err
    assert main([*args, "--out", str(out)]) == 2  # without a judge, its examples would be drawn
    assert "would not leave out" in capsys.readouterr().err
    with pytest.raises(DataError, match="pool larger"):
        write_fresh_splits(root / "full", root / "k-shot", tmp_path / "x", "mpqa", [2001], judge=500)


def test_an_out_that_is_a_file_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    root = _data(tmp_path)
    taken = tmp_path / "taken.txt"
    taken.write_text("not a directory\n")
    args = ["splits", "--data", str(root), "--task", "mpqa", "--seeds", "1001", "--out", str(taken)]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("python -m research splits: error: ")
    assert taken.read_text() == "not a directory\n"
