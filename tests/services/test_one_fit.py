"""One fit pipeline: a trainer's job, `openbook train` and the library's `fit` + `save` write the same
checkpoint from the same examples, split and seed (openbook.fitting, through `Estimator.fit` and `.save`).

The k-shot split's train and dev examples are posted to the task's log under ids whose hash (the service's
dev split, `dev_split.in_dev`) holds out exactly dev, in their files' order: the job then trains on what
`openbook train` trains on. The library fits them twice: dev given apart (as the command line gives it),
and dev held out by the ids' hash (as the job holds it out). Every checkpoint has the same files and the
same weights, dev metrics, kNN setting and confidence; where dev is held out of the examples the store
holds it too (the job, and the library's hash split), and where it is given apart, not.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import openbook
import redis
import torch
from openbook.backbone import BackboneConfig, load_backbone
from openbook.cli.common import train_config
from openbook.data import Example, load_train_dev
from openbook.dev_split import in_dev
from openbook.store_snapshot import read_snapshot
from safetensors.torch import load_file

from services.bus.examples_log import ExampleLog, NewExample
from services.bus.jobs import JobQueue
from services.bus.keys import TASKS_KEY
from services.cli import build_parser, main
from services.engine.task_spec import Task
from services.trainer.worker import Worker

TEMPLATE = "{text} It was {mask}"
LABELS = {"0": "bad", "1": "good"}
METHOD = "retroprompt"  # k, T and lambda chosen on dev, and the store served with them
SEED = 1
FLAGS = ["--steps", "4", "--eval-every", "2", "--train-batch-size", "4", "--lr", "1e-3", "--max-length", "48"]


def log_ids(train: list[Example], dev: list[Example]) -> tuple[list[int], list[int]]:
    """Ids for the train and dev examples, in order, that the service's hash puts on the same sides."""
    train_ids: list[int] = []
    dev_ids: list[int] = []
    candidate = 0
    while len(train_ids) < len(train) or len(dev_ids) < len(dev):
        side, wanted = (dev_ids, len(dev)) if in_dev(candidate) else (train_ids, len(train))
        if len(side) < wanted:
            side.append(candidate)
        candidate += 1
    return train_ids, dev_ids


def fresh_estimator(causal_dir: Path) -> openbook.Estimator:
    """The library's untrained classifier on a newly loaded backbone (training changes its weights)."""
    backbone = load_backbone(BackboneConfig(name=str(causal_dir), max_length=48))
    return openbook.create_classifier(TEMPLATE, LABELS, backbone=backbone, method=METHOD)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "weights.safetensors")


def test_a_job_openbook_train_and_fit_write_the_same_checkpoint(
    server, causal_dir: Path, tmp_path: Path, toy_dataset, capsys
) -> None:
    data = toy_dataset(tmp_path / "data", seeds=(SEED,))
    train, dev = load_train_dev(data, "toy", SEED)
    train_ids, dev_ids = log_ids(train, dev)
    cli = [
        "train", "--data", str(data), "--task", "toy", "--seed", str(SEED), "--method", METHOD,
        "--template", TEMPLATE, "--labels", "0=bad,1=good", "--backbone", str(causal_dir), *FLAGS,
    ]  # fmt: skip
    options = dataclasses.asdict(train_config(build_parser().parse_args([*cli, "--out", "o"]), SEED))

    # the command line: the k-shot split, its dev given apart
    assert main([*cli, "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()

    # the trainer's job: the same examples in the task's log, dev held out by their ids' hash
    client = redis.Redis.from_url(server.url)
    task = Task(name="toy", template=TEMPLATE, labels=LABELS, backbone=str(causal_dir), method=METHOD)
    client.hset(TASKS_KEY, task.name, task.model_dump_json())
    posted = [*zip(train_ids, train, strict=True), *zip(dev_ids, dev, strict=True)]
    ExampleLog(client, task.name).append([NewExample(e.text, e.label, i) for i, e in posted])
    job_id = JobQueue(client).submit(task.name, METHOD, options, force=True)
    assert Worker(client, tmp_path / "artifacts", max_length=48).run_once(block_ms=100) == job_id
    job = JobQueue(client).get(job_id)
    assert job is not None and job["state"] == "succeeded", job
    served = Path(job["published"]["path"])

    # the library: dev given apart, as the command line gives it; and held out by the same ids' hash
    given = fresh_estimator(causal_dir)
    report = given.fit(
        [e.text for e in train],
        [e.label for e in train],
        dev=([e.text for e in dev], [e.label for e in dev]),
        **options,
    )
    assert report.train_ids == list(range(len(train)))
    held_out = fresh_estimator(causal_dir)
    report = held_out.fit(
        [e.text for _, e in posted], [e.label for _, e in posted], ids=[i for i, _ in posted], **options
    )
    assert (report.train_ids, report.dev_ids) == (train_ids, dev_ids)  # the k-shot split, by hash

    paths = {
        "cli": tmp_path / "cli",
        "job": served,
        "fit, dev given": given.save(tmp_path / "given"),
        "fit, dev held out": held_out.save(tmp_path / "held-out"),
    }
    manifests = {name: json.loads((path / "manifest.json").read_text()) for name, path in paths.items()}
    reference = manifests["cli"]
    first = weights(paths["cli"])
    assert first and all(t.numel() for t in first.values())
    for name, path in paths.items():
        manifest = manifests[name]
        assert sorted(manifest["files"]) == sorted(reference["files"]), name
        tensors = weights(path)
        assert sorted(tensors) == sorted(first), name
        assert all(torch.equal(tensors[key], first[key]) for key in first), name
        for key in ("dev_metrics", "knn", "confidence_temperature", "train_config", "backbone", "spec"):
            assert manifest[key] == reference[key], (name, key)
    assert reference["knn"]["lam"] is not None and "accuracy_with_knn" in reference["dev_metrics"]

    # the stores: the train examples where dev was given apart, every example where it was held out
    for apart, together in (("cli", "fit, dev given"), ("job", "fit, dev held out")):
        ours, theirs = read_snapshot(paths[apart] / "store"), read_snapshot(paths[together] / "store")
        np.testing.assert_array_equal(ours.ids(), theirs.ids())
        np.testing.assert_array_equal(ours.vectors_of(ours.ids()), theirs.vectors_of(theirs.ids()))
        assert manifests[apart]["training_data_sha256"] == manifests[together]["training_data_sha256"]
    assert read_snapshot(paths["cli"] / "store").ids().tolist() == list(range(len(train)))
    assert read_snapshot(paths["job"] / "store").ids().tolist() == sorted(train_ids + dev_ids)
    assert manifests["job"]["log_offset"] == job["published"]["log_offset"]
    assert manifests["job"]["dev_scored_on"] == manifests["cli"]["dev_scored_on"] == "dev"
