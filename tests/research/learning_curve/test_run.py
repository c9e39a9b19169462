"""`python -m research learning-curve` end to end on the tiny model: the real stack, automatic training, both
orders."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from openbook.methods import method_config
from openbook.version import __version__

from research.experiments.setfit_peer import SetFitConfig
from research.learning_curve.baselines import BASELINES
from research.learning_curve.report import CurveRecord, read_results, write_results
from research.learning_curve.run import run_learning_curve, source
from research.learning_curve.settings import CurveSettings
from research.learning_curve.setup import check_same_setup, merge_results, relabel_curve

WORDS = {"1": ["great", "fun", "good", "lovely"], "0": ["bad", "awful", "boring", "terrible"]}


def _full_sst2(root: Path) -> Path:
    """A toy `full/` directory with SST-2's file names: 40 training and 8 test sentences."""
    root.mkdir(parents=True)
    lines = [f"{label} the film was {WORDS[label][i % 4]} , scene {i}" for i in range(40) for label in "01"]
    (root / "stsa.binary.train").write_text("\n".join(lines[:80]) + "\n")
    test = [f"{label} a {WORDS[label][i % 4]} movie" for i in range(4) for label in "01"]
    (root / "stsa.binary.dev").write_text("\n".join(test) + "\n")
    return root


def test_a_labeller_drives_the_service_round_by_round(causal_dir: Path, tmp_path: Path) -> None:
    settings = CurveSettings(
        _full_sst2(tmp_path / "full"),
        tmp_path / "out",
        ["SST-2"],
        [13],
        backbone=str(causal_dir),
        rounds=[2, 4],
        baselines=["knn-interp", "prompt-ft"],
        test_size=8,
        pool_size=16,
        training={"steps": 2, "batch_size": 4, "lr": 1e-4, "eval_every": 1, "patience": 1},
        max_length=48,
    )
    records = run_learning_curve(settings, progress=False, say=lambda line: None)
    service = [r for r in records if r.method == "service"]
    assert sorted((r.order, r.shots) for r in service) == [
        ("fixed", 2),
        ("fixed", 4),
        ("uncertainty", 2),
        ("uncertainty", 4),
    ]
    for record in service:
        assert record.labelled == 2 * record.shots  # two classes, cumulative
        assert 0.0 <= record.accuracy <= 1.0
        # every round's labels queued exactly one automatic job, which finished with a verdict
        assert record.service["auto_jobs"] == 1, record.service
        # the first round's job is the task's first; a later one is judged against what serves
        expected = ("first",) if record.shots == 2 else ("promoted", "rejected")
        assert record.service["verdict"] in expected, record.service
        alone = record.service["alone"]  # each reader of the served version alone, on the same sample
        assert set(alone) == {"prompt", "book"} and all(0.0 <= alone[r] <= 1.0 for r in alone), alone
    first = [r for r in service if r.shots == 2]
    assert first[0].accuracy == first[1].accuracy  # both orders start from the same first round
    assert {(r.method, r.shots) for r in records if r.method != "service"} == {
        (method, shots) for method in ("knn-interp", "prompt-ft") for shots in (2, 4)
    }
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(saved["records"]) == len(records)
    source = saved["runs"][0]["source"]  # the code that made the run
    assert source["openbook"] == __version__
    if (Path(__file__).resolve().parents[3] / ".git").exists():  # a checkout (a worktree's .git is a file)
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), source
        assert isinstance(source["dirty"], bool)
    assert (tmp_path / "out" / "results.png").stat().st_size > 0
    assert "| " in (tmp_path / "out" / "results.md").read_text()

    # A baseline added afterwards, without the service: the rounds' examples are the ones the service was
    # given, so the untrained task recomputed alone scores as it did beside the service.
    runs, _ = read_results(tmp_path / "out")
    kept = [r for r in records if r.method != "knn-interp"]
    write_results(tmp_path / "out", runs, kept, plot=False)
    alone = dataclasses.replace(settings, orders=["fixed"], baselines=["knn-interp"], baselines_only=True)
    again = run_learning_curve(alone, progress=False, say=lambda line: None)
    assert [r for r in again if r.method != "knn-interp"] == kept  # the service's rounds untouched
    assert sorted((r.shots, r.labelled, r.accuracy) for r in again if r.method == "knn-interp") == sorted(
        (r.shots, r.labelled, r.accuracy) for r in records if r.method == "knn-interp"
    )
    assert run_learning_curve(alone, progress=False, say=lambda line: None) == again  # nothing run twice
    with pytest.raises(ValueError, match="the fixed order alone"):
        dataclasses.replace(alone, orders=["fixed", "uncertainty"])


def _recorded(settings: CurveSettings, **changes: object) -> dict:
    """A run of `settings` as results.json records it, with `changes` over its settings."""
    return {
        "settings": {
            "backbone": settings.backbone,
            "method": settings.method,
            "method_config": method_config(settings.method),
            "test_size": settings.test_size,
            "pool_size": settings.pool_size,
            "training": dict(settings.training),
            "max_length": settings.max_length,
            **changes,
        }
    }


def test_records_are_added_to_only_under_the_same_method_backbone_and_scoring(tmp_path: Path) -> None:
    settings = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13])
    check_same_setup(settings, [_recorded(settings), _recorded(settings, seeds=[21])])  # units may differ
    for changes, named in [
        ({"method_config": method_config("retroprompt/demos=neural")}, "method"),
        ({"test_size": 200}, "test_size"),
        ({"backbone": "smollm2-135m"}, "backbone"),
        ({"training": {**settings.training, "steps": 64}}, "training"),
        ({"untrained_gate": True}, "untrained_gate"),  # a run recorded without the key ran without it
        ({"judge": 200}, "judge"),
        ({"reader": "mpnet"}, "reader"),  # a run recorded without the key had no reader
    ]:
        with pytest.raises(ValueError, match=f"other settings \\({named}"):
            check_same_setup(settings, [_recorded(settings), _recorded(settings, **changes)])
    with pytest.raises(ValueError, match="demos must be one of"):
        CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13], method="retroprompt/demos=vectors")
    with_reader = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13], reader="mpnet")
    check_same_setup(with_reader, [_recorded(with_reader, reader="mpnet")])
    with pytest.raises(ValueError, match="other settings \\(reader"):
        check_same_setup(with_reader, [_recorded(with_reader)])


def test_setfit_rounds_are_added_to_only_under_the_same_encoder_and_options(tmp_path: Path) -> None:
    """A run's setfit rounds are not added to by a SetFit of other options (all-MiniLM-L6-v2 with no cap
    against today's all-mpnet-base-v2); a run without the baseline does not matter."""
    settings = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13])  # the default baselines
    today = {"setfit": asdict(SetFitConfig())}
    check_same_setup(settings, [_recorded(settings, baselines=list(BASELINES), peer_configs=today)])
    check_same_setup(settings, [_recorded(settings, baselines=["knn-interp"])])  # setfit was skipped
    uncapped = asdict(SetFitConfig(encoder="minilm", max_steps=0))
    other = _recorded(settings, baselines=list(BASELINES), peer_configs={"setfit": uncapped})
    with pytest.raises(ValueError, match=r"other settings \(baseline setfit: .*'encoder': 'minilm'"):
        check_same_setup(settings, [other])
    minilm = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13], baselines=["setfit/encoder=minilm"])
    named = {"baselines": ["setfit/encoder=minilm"], "peer_configs": {"setfit/encoder=minilm": uncapped}}
    with pytest.raises(ValueError, match="baseline setfit/encoder=minilm"):  # recorded: no cap
        check_same_setup(minilm, [_recorded(minilm, **named)])


def test_baselines_alone_are_checked_only_on_what_they_depend_on(tmp_path: Path) -> None:
    """A SetFit baseline added alone joins a curve whose service ran under another budget and method, not
    one scored on another sample; prompt-ft, which trains as the jobs do, needs their budget."""
    setfit = CurveSettings(
        tmp_path,
        tmp_path / "out",
        ["SST-2"],
        [13],
        orders=["fixed"],
        baselines=["setfit"],
        baselines_only=True,
    )
    service = _recorded(setfit, training={**setfit.training, "steps": 64}, method_config={"name": "other"})
    check_same_setup(setfit, [service])
    with pytest.raises(ValueError, match=r"other settings \(test_size"):
        check_same_setup(setfit, [_recorded(setfit, test_size=200)])
    prompt_ft = dataclasses.replace(setfit, baselines=["prompt-ft"])
    with pytest.raises(ValueError, match=r"other settings \(training"):
        check_same_setup(prompt_ft, [service])
    # and a run of baselines alone holds a later run of the service only to what it measured
    today = {"setfit": asdict(SetFitConfig())}
    alone = _recorded(setfit, baselines=["setfit"], baselines_only=True, peer_configs=today)
    check_same_setup(dataclasses.replace(setfit, baselines=["knn-interp"], baselines_only=False), [alone])


def test_setfit_baselines_are_renamed_by_what_they_ran_so_todays_joins_them(tmp_path: Path) -> None:
    """A curve whose setfit rounds ran all-MiniLM-L6-v2 uncapped (the peer before MPNet): relabelled, its
    records and runs name them setfit/encoder=minilm/max-steps=0, and today's setfit may be added."""
    settings = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13])  # the default baselines
    uncapped = asdict(SetFitConfig(encoder="minilm", max_steps=0))
    old = _recorded(settings, baselines=list(BASELINES), peer_configs={"setfit": uncapped})
    records = [
        CurveRecord("SST-2", 13, "fixed", method, 2, 4, 0.5, 1.0)
        for method in ("service", "setfit", "prompt-ft")
    ]
    write_results(tmp_path / "out", [old], records, plot=False)
    with pytest.raises(ValueError, match="baseline setfit"):
        check_same_setup(settings, read_results(tmp_path / "out")[0])

    assert relabel_curve(tmp_path / "out") == {"setfit": "setfit/encoder=minilm/max-steps=0"}
    runs, renamed = read_results(tmp_path / "out")
    assert [r.method for r in renamed] == ["service", "setfit/encoder=minilm/max-steps=0", "prompt-ft"]
    assert runs[0]["settings"]["baselines"] == [
        "knn-interp",
        "prompt-ft",
        "setfit/encoder=minilm/max-steps=0",
    ]
    check_same_setup(settings, runs)  # today's setfit (MPNet) is another series now
    assert relabel_curve(tmp_path / "out") == {}  # named by what it ran already

    # one name for runs of two options cannot be told apart: refused, nothing written
    today = _recorded(settings, baselines=["setfit"], peer_configs={"setfit": asdict(SetFitConfig())})
    write_results(tmp_path / "mixed", [old, today], records, plot=False)
    before = (tmp_path / "mixed" / "results.json").read_text()
    with pytest.raises(ValueError, match="setfit names runs of different options"):
        relabel_curve(tmp_path / "mixed")
    assert (tmp_path / "mixed" / "results.json").read_text() == before


def test_the_code_is_dirty_only_for_changes_outside_the_output_directory(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    clean = source(tmp_path / "out", root=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["commit"]) and clean["dirty"] is False
    (tmp_path / "out" / "results.json").write_text('{"runs": []}')  # what a resumed run rewrites
    assert source(tmp_path / "out", root=tmp_path)["dirty"] is False
    assert source(None, root=tmp_path)["dirty"] is True
    (tmp_path / "code.py").write_text("x = 2\n")
    assert source(tmp_path / "out", root=tmp_path)["dirty"] is True
    assert source(tmp_path / "out", root=tmp_path / "no-repo")["commit"] is None  # not a checkout


def _unit_dir(root: Path, settings: CurveSettings, unit: tuple[str, int, str], **changes: object) -> Path:
    """An output directory as one process writes it: one run, its unit's service records at rounds 2 and 4."""
    task, seed, order = unit
    run = _recorded(settings, **changes) | {"command": f"openbook bench learning-curve --task {task}"}
    records = [
        CurveRecord(task, seed, order, "service", shots, 2 * shots, 0.5 + shots / 100, 1.0)
        for shots in (2, 4)
    ]
    directory = root / f"{task}-{seed}-{order}"
    write_results(directory, [run], records, plot=False)
    return directory


def test_units_run_apart_merge_into_one_curve_and_never_twice(tmp_path: Path) -> None:
    settings = CurveSettings(tmp_path, tmp_path / "out", ["SST-2"], [13])
    a = _unit_dir(tmp_path / "a", settings, ("SST-2", 13, "fixed"))
    b = _unit_dir(tmp_path / "b", settings, ("SST-2", 13, "uncertainty"))
    merged = merge_results(tmp_path / "out", [a, b])
    assert sorted({(r.order, r.shots) for r in merged}) == [
        ("fixed", 2),
        ("fixed", 4),
        ("uncertainty", 2),
        ("uncertainty", 4),
    ]
    runs, records = read_results(tmp_path / "out")
    assert len(runs) == 2 and records == merged
    # the same unit again, another method's unit, or a directory with nothing: refused, nothing written
    before = (tmp_path / "out" / "results.json").read_text()
    other = _unit_dir(tmp_path / "c", settings, ("trec", 13, "fixed"), test_size=200)
    for sources, message in [
        ([a], "recorded more than once"),
        ([other], "differ in test_size"),
        ([tmp_path / "empty"], "holds no learning-curve results"),
    ]:
        with pytest.raises(ValueError, match=message):
            merge_results(tmp_path / "out", sources)
    assert (tmp_path / "out" / "results.json").read_text() == before
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_results(tmp_path / "fresh", [])


def test_units_run_as_processes_each_merged_as_it_ends_and_the_grid_resumes(
    causal_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from research.cli import main

    out = tmp_path / "out"
    training = {"steps": 2, "batch_size": 4, "lr": 1e-4, "eval_every": 1, "patience": 1}
    args = [
        *["learning-curve", "--task", "SST-2", "--seeds", "13", "--rounds", "2"],
        *["--data", str(_full_sst2(tmp_path / "full")), "--out", str(out), "--backbone", str(causal_dir)],
        *["--baselines", "knn-interp", "--test-size", "8", "--pool-size", "16", "--max-length", "48"],
        *[token for key, value in training.items() for token in (f"--{key.replace('_', '-')}", str(value))],
        *["--parallel", "2"],
    ]
    # what a serial run stopped midway leaves: the fixed order's service record, not yet its baseline's
    settings = CurveSettings(
        tmp_path / "full", out, ["SST-2"], [13], backbone=str(causal_dir), baselines=["knn-interp"],
        test_size=8, pool_size=16, training={**training, "keep": "last"}, max_length=48,
    )  # fmt: skip
    partial = CurveRecord("SST-2", 13, "fixed", "service", 2, 4, accuracy=0.125, seconds=1.0)
    write_results(out, [_recorded(settings) | {"command": "a serial run"}], [partial], plot=False)

    assert main(args) == 0
    runs, records = read_results(out)
    assert sorted((r.order, r.method) for r in records) == [
        ("fixed", "knn-interp"),
        ("fixed", "service"),
        ("uncertainty", "service"),
    ]
    assert partial not in records  # the unit ran again in full, and its records replaced the partial one
    commands = [run["command"] for run in runs[1:]]  # each unit's own command
    assert sorted(c.split("--orders ")[1].split()[0] for c in commands) == ["fixed", "uncertainty"]
    assert all("--parallel" not in c and f"--out {out}/units/" in c for c in commands), commands
    assert not (out / "units").exists()  # merged, then removed
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["SST-2-13-fixed.log", "SST-2-13-uncertainty.log"]

    capsys.readouterr()
    assert main(args) == 0  # resumed: every unit is in results.json already, and nothing runs
    assert "already" in capsys.readouterr().out
    assert read_results(out)[1] == records

    # a baseline added alone, as a process: merged beside the unit's records, which stay
    alone = [
        *args[: args.index("--baselines")],
        "--baselines",
        "prompt-ft",
        *args[args.index("--test-size") :],
    ]
    assert main([*alone, "--orders", "fixed", "--baselines-only"]) == 0
    _, added = read_results(out)
    assert sorted((r.order, r.method) for r in added) == [
        ("fixed", "knn-interp"),
        ("fixed", "prompt-ft"),
        ("fixed", "service"),
        ("uncertainty", "service"),
    ]
    assert all(r in added for r in records)


@pytest.mark.parametrize(("flag", "recorded"), [([], "last"), (["--keep", "best"], "best")])
def test_keep_reaches_the_jobs_training_settings_as_a_service_jobs_default(
    monkeypatch, tmp_path: Path, flag: list[str], recorded: str | None
) -> None:
    from research.cli import main

    ran: list[CurveSettings] = []
    monkeypatch.setattr("research.learning_curve.run.run_learning_curve", ran.append)
    argv = ["learning-curve", "--task", "SST-2", "--seeds", "13", "--data", str(tmp_path), *flag]
    argv += ["--out", str(tmp_path / "out")]
    assert main(argv) == 0
    # the last weights by default, as a service job keeps them; recorded either way (the curves made
    # before the option record the best weights they kept)
    assert ran[0].training["keep"] == recorded
