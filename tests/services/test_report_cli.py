"""`openbook report`: a running service's task, and a checkpoint read without one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from services.api.app import create_app
from services.cli import main
from tests.services.harness import CLUSTER_EXAMPLES, CLUSTERS_TASK, api_settings, serving


def test_report_of_a_task_prints_its_suspect(server, causal_dir, capsys) -> None:
    import httpx

    with serving(create_app(api_settings(server.url, causal_dir))) as url:
        assert httpx.post(f"{url}/v1/tasks", json=CLUSTERS_TASK).status_code == 201
        body = {"examples": CLUSTER_EXAMPLES}
        assert httpx.post(f"{url}/v1/tasks/clusters/examples", json=body).status_code == 201

        assert main(["report", "--task", "clusters", "--url", url]) == 0
        printed = capsys.readouterr().out
        assert "11 examples scored by leave-one-out" in printed
        suspects = printed.split("suspect examples (")[1].splitlines()  # the mislabelled one comes first
        assert suspects[1].split()[:4] == ["42", "b", "->", "a"]

        assert main(["report", "--task", "clusters", "--url", url, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert (
            report["suspect_examples"][0]["id"] == 42 and np.array(report["confusion"]["matrix"]).sum() == 11
        )
        pairs = [f"  {p['label']} -> {p['predicted']}: {p['count']}" for p in report["confused_pairs"]]
        assert pairs and printed.split("most confused (")[1].splitlines()[1:][: len(pairs)] == pairs

        assert main(["report", "--task", "nope", "--url", url]) == 2
        assert "404" in capsys.readouterr().err


def test_report_of_a_checkpoint_needs_no_service(
    causal_dir, tmp_path: Path, toy, fresh_classifier, capsys
) -> None:
    from openbook.estimator import Estimator

    classifier, method = fresh_classifier(causal_dir, "retroprompt")
    estimator = Estimator(classifier, method)
    words = [toy.verbalizer.labels[i] for i in toy.labels]
    dev = (["great fun", "a good film", "boring and bad", "a terrible film"], ["1", "1", "0", "0"])
    fitted = estimator.fit(toy.texts, words, dev=dev, steps=2, batch_size=4, eval_every=1)
    path = estimator.save(tmp_path / "ckpt")
    assert main(["report", "--checkpoint", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scored_by"] == "dev" and report["examples"] == 4
    assert report["calibration"]["ece_before"] == pytest.approx(
        fitted.dev_metrics["calibration"]["ece_before"], abs=1e-5
    )
    assert report["readers"]["prompt"] == fitted.dev_metrics["accuracy"]
    assert report["readers"]["book"] == fitted.dev_metrics["accuracy_knn_alone"]
    assert main(["report", "--checkpoint", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "calibration: ECE" in printed
    prompt = fitted.dev_metrics["accuracy"]
    assert f"readers: the prompt alone {prompt:.3f}, the book alone (keyed by slot vectors)" in printed

    manifest = json.loads((path / "manifest.json").read_text())
    shutil.copytree(path, tmp_path / "old")
    (tmp_path / "old" / "manifest.json").write_text(json.dumps({**manifest, "dev_scores": None}))
    assert main(["report", "--checkpoint", str(tmp_path / "old")]) == 2
    assert "keeps no dev scores" in capsys.readouterr().err
    (tmp_path / "old" / "manifest.json").write_text("[]")  # valid JSON, not a manifest
    assert main(["report", "--checkpoint", str(tmp_path / "old")]) == 2
    assert 'no "files" mapping' in capsys.readouterr().err
