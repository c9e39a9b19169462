"""The corpus IPT's prompt table is pretrained on: the full training sets with every k-shot text held out."""

from __future__ import annotations

from pathlib import Path

from openbook.backbone import Backbone

from research.experiments.ipt_table import _normalise, kshot_texts, read_full_corpus


def test_corpus_reader_drops_kshot_texts_and_empty_lines(causal_backbone: Backbone, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    lines = ["1 a fine film", "0 a dull film", "0", "1 the test text", "0 a Dev  Text", "1 a bright film"]
    (tmp_path / "full" / "mpqa.all").write_text("\n".join(lines) + "\n")
    for split, row in [("test", "1,the test text"), ("16-13/dev", "0,a dev text"), ("16-13/train", "1,x y")]:
        (tmp_path / "k-shot" / "mpqa" / split).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "k-shot" / "mpqa" / f"{split}.csv").write_text(row + "\n")
    held_out = kshot_texts(tmp_path)
    assert held_out == {"the test text", "a dev text", "x y"}
    corpus = read_full_corpus(tmp_path, "mpqa", causal_backbone, per_task=10, seed=0, held_out=held_out)
    labels = {text: corpus.verbalizer.labels[i] for text, i in zip(corpus.texts, corpus.labels, strict=True)}
    assert labels == {"a fine film": "1", "a dull film": "0", "a bright film": "1"}


def test_real_corpus_sample_is_fixed_and_holds_out_kshot_texts(
    causal_backbone: Backbone, datasets_root: Path
) -> None:
    held_out = kshot_texts(datasets_root)
    assert len(held_out) > 4000  # the mpqa and sst-5 test sets alone hold 4210 texts
    first = read_full_corpus(datasets_root, "mpqa", causal_backbone, per_task=64, seed=0, held_out=held_out)
    again = read_full_corpus(datasets_root, "mpqa", causal_backbone, per_task=64, seed=0, held_out=held_out)
    assert len(first.texts) == 64 and list(first.texts) == list(again.texts)
    assert not any(_normalise(text) in held_out for text in first.texts)
    assert set(first.labels.tolist()) == {0, 1}
