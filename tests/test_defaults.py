"""One set of defaults (the config dataclasses), and every door builds from it: the library
(`openbook.create_classifier` and its `fit`), the command line (`openbook classify` and `openbook train`)
and the service (a task created from a minimal spec, the api's `Settings`, the trainer's `Worker`) give
the same untrained classifier and the same training run when nothing is asked. Each test compares what
the doors built, value for value, so that any door that differs fails it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import openbook
import pytest
import redis
from openbook.config_fields import default_of, help_of
from openbook.devices import resolve_device
from openbook.encoders import chosen_reader
from openbook.methods import DEFAULT_METHOD, build_method
from openbook.train_config import TrainConfig

from services.api.settings import Settings
from services.cli import build_parser, main
from services.engine.backbones import Backbones
from services.engine.task_spec import Task, TaskCreate, TrainOptions, task_classifier
from services.trainer.worker import Worker

TEMPLATE = "{text} It was {mask}"
LABELS = {"0": "bad", "1": "good"}
# The second text is longer than any max_length a door might cut at: a door that cuts elsewhere scores it
# differently, and says so (`truncated`).
TEXTS = ["a great film", "the movie was great and fun " * 60]


@pytest.fixture
def defaults_only(monkeypatch: pytest.MonkeyPatch, causal_dir: Path, reader_mpnet_dir: Path) -> Path:
    """No OPENBOOK_* setting but the default backbone and reader, tiny ones, so that every door loads them
    unasked."""
    import os

    for name in [name for name in os.environ if name.startswith("OPENBOOK_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OPENBOOK_DEFAULT_BACKBONE", str(causal_dir))
    monkeypatch.setenv("OPENBOOK_DEFAULT_READER", str(reader_mpnet_dir))
    return causal_dir


def minimal_task(settings: Settings) -> Task:
    """A task as POST /v1/tasks creates it from its three required fields (services/api/routes/tasks.py)."""
    body = TaskCreate(name="reviews", template=TEMPLATE, labels=LABELS)
    return body.as_task(settings.default_backbone, settings.default_reader)


def spelled(config: TrainConfig) -> dict[str, Any]:
    """Every field of a run's config, its budget spelled out as it runs (`TrainConfig.budget`)."""
    return dataclasses.asdict(dataclasses.replace(config, **config.budget()))


def test_every_door_builds_the_same_untrained_classifier(defaults_only: Path, capsys) -> None:
    library = openbook.create_classifier(TEMPLATE, LABELS)

    assert main(["classify", *TEXTS, "--template", TEMPLATE, "--labels", "0=bad,1=good"]) == 0
    cli_args = build_parser().parse_args(
        ["classify", "x", "--template", TEMPLATE, "--labels", "0=bad,1=good"]
    )
    cli_predictions = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    settings = Settings()
    task = minimal_task(settings)
    backbones = Backbones(
        max_length=settings.max_length, device=settings.device, default_backbone=task.backbone
    )
    service = task_classifier(task, backbones.backbone(task.backbone))
    worker = Worker(redis.Redis(), defaults_only / "unused")

    knn = library.classifier.knn
    assert library.classifier.reader is not None and service.reader is not None
    doors = {
        "library": {
            "reader": library.classifier.reader.config.encoder,
            "max_length": library.classifier.backbone.config.max_length,
            "device": str(library.classifier.backbone.device),
            "method": library.method.spec,
            "k": knn.k,
            "temperature": knn.temperature,
            "similarity": knn.similarity,
        },
        # `openbook train` asks for its --method; classify trains nothing, nor sets the similarity
        "cli": {
            "reader": chosen_reader(cli_args.reader),
            "max_length": cli_args.max_length,
            "device": cli_args.device,
            "k": cli_args.k,
            "temperature": cli_args.temperature,
        },
        "service": {
            "reader": service.reader.config.encoder,
            "max_length": service.backbone.config.max_length,
            "device": str(service.backbone.device),
            "method": task.method,
            "k": service.knn.k,
            "temperature": service.knn.temperature,
            "similarity": service.knn.similarity,
        },
        "settings": {
            "reader": settings.default_reader,
            "max_length": settings.max_length,
            "device": resolve_device(settings.device),
            "method": task.method,
            "k": task.knn.k,
            "temperature": task.knn.temperature,
            "similarity": task.knn.similarity,
        },
        "worker": {
            "max_length": worker.max_length,
            "device": resolve_device(worker.device),
            "method": task.method,
            "k": task.knn.k,
            "temperature": task.knn.temperature,
            "similarity": task.knn.similarity,
        },
    }
    for door, values in doors.items():
        assert values == {key: doors["library"][key] for key in values}, door
    # lambda while untrained: chosen on the stored examples at the command line and in the service (the
    # library's classifier has none stored before `fit`, which chooses it on dev)
    assert cli_args.lam is None and task.knn.lam is None
    assert service.knn == library.classifier.knn

    # ... and they predict alike, the text that is too long cut alike
    expected = [dataclasses.asdict(p) for p in library.predict(TEXTS)]
    assert [dataclasses.asdict(p) for p in service.predict(TEXTS)] == expected
    as_printed = json.loads(
        json.dumps([{"text": text, **p} for text, p in zip(TEXTS, expected, strict=True)])
    )
    assert cli_predictions == as_printed
    assert [p["truncated"] for p in expected] == [False, True]


def test_every_door_trains_with_the_same_config(defaults_only: Path, tmp_path: Path, toy) -> None:
    estimator = openbook.create_classifier(TEMPLATE, LABELS)
    estimator.fit(toy.texts * 2, [toy.verbalizer.labels[i] for i in toy.labels] * 2)
    # as the checkpoint records it, as a service job's checkpoint does
    saved = json.loads((estimator.save(tmp_path / "fitted") / "manifest.json").read_text())["train_config"]
    library = spelled(TrainConfig(**saved))

    args = build_parser().parse_args(
        ["train", "--task", "toy", "--method", DEFAULT_METHOD, "--seed", "21", "--out", "unused"]
    )
    from openbook.cli.common import train_config

    cli = spelled(train_config(args, args.seed))
    service = spelled(TrainConfig(**minimal_task(Settings()).training.train_config()))

    assert service == library
    # `openbook train --seed` names the data split as well as the training seed, and has no default
    assert {**cli, "seed": library["seed"]} == library and cli["seed"] == 21
    assert library["epochs"] is not None and library["steps"] is None  # the default budget, spelled out


def test_a_task_trains_by_itself_behind_the_gate_unless_told_not_to(defaults_only: Path) -> None:
    settings = Settings()
    task = minimal_task(settings)
    assert task.training.auto and settings.untrained_gate
    assert Worker(redis.Redis(), defaults_only / "unused").untrained_gate == settings.untrained_gate
    off = TaskCreate(name="reviews", template=TEMPLATE, labels=LABELS, training={"auto": False})
    assert not off.training.auto


def test_the_default_method_is_registered_and_each_door_shows_the_fields_help(capsys) -> None:
    assert build_method(DEFAULT_METHOD).spec == DEFAULT_METHOD
    schema = TrainOptions.model_json_schema()["properties"]
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for name in ("steps", "epochs", "max_steps", "min_steps", "batch_size", "lr", "patience", "keep"):
        assert schema[name]["description"] == help_of(TrainConfig, name)
        assert schema[name].get("default") == default_of(TrainConfig, name)
        assert help_of(TrainConfig, name) in shown, name
