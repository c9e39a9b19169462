"""`python -m research learning-curve`: accuracy against labelled examples, as a user of the service lives it.

The real stack runs in this process, as `bench api` runs it: the embedded Redis, the api under uvicorn
on a local port (real HTTP) and the trainer worker in a thread, with automatic training on. Per task,
seed and labelling order a fresh service task is labelled round by round (`service.py`); after each
fixed-order round the baselines are computed on the same examples (`baselines.py`). Every record is
written as soon as it exists; a (task, seed, order) whose records are all in results.json is skipped.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.devices import default_dtype, resolve_dtype
from openbook.encoders import NO_READER
from openbook.methods import method_config
from openbook.train_config import TrainConfig
from openbook.version import __version__
from tqdm.auto import tqdm

from research.learning_curve.baselines import Baselines, unavailable
from research.learning_curve.report import (
    SERVICE,
    CurveRecord,
    check_target,
    read_results,
    target_lines,
    write_results,
)
from research.learning_curve.schedule import (
    CurveData,
    fixed_rounds,
    load_curve_data,
)
from research.learning_curve.service import label_and_score
from research.learning_curve.settings import CurveSettings
from research.learning_curve.setup import check_same_setup, merge_results, peer_configs_of
from services.bench_stack import service_stack
from services.engine.task_spec import TaskCreate


def hardware() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        names = re.findall(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__}


def source(out: Path | None = None, root: Path | None = None) -> dict:
    """The code that made a run: the package version, and the git commit when run from a checkout
    (`dirty`: with uncommitted changes to tracked files, outside `out`, which a resumed run rewrites).
    `root`: the checkout; by default the one this module is in."""
    root = (root or Path(__file__).parents[2]).resolve()
    commit, dirty = None, None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(root)]
        commit = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        outside = []
        if out is not None and out.resolve().is_relative_to(root):
            outside = ["--", ".", f":(exclude){out.resolve().relative_to(root)}"]
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", *outside],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = bool(status.stdout.strip())
    return {"openbook": __version__, "commit": commit, "dirty": dirty}


def _unit_series(s: CurveSettings, order: str, baselines: Sequence[str]) -> list[str]:
    """The series a (task, seed, order) unit of `s` records: the service (unless baselines alone run) and,
    in the fixed order, the baselines."""
    return ([] if s.baselines_only else [SERVICE]) + (list(baselines) if order == "fixed" else [])


def _unit_done(
    records: Sequence[CurveRecord], unit: tuple[str, int, str], series: Sequence[str], rounds: Sequence[int]
) -> bool:
    have = {(r.method, r.shots) for r in records if (r.task, r.seed, r.order) == unit}
    return all((method, shots) in have for method in series for shots in rounds)


def run_learning_curve(
    s: CurveSettings, *, progress: bool = True, say: Callable[[str], None] = print
) -> list[CurveRecord]:
    """Run every (task, seed, order) not already in `s.out`/results.json; returns all the records."""
    skipped = unavailable(s.baselines)
    for name, why in skipped.items():
        say(f"skipping the {name} baseline: {why}")
    baselines = [name for name in s.baselines if name not in skipped]
    runs, records = read_results(s.out)
    check_same_setup(s, runs)
    # all data checked first
    data = {task: load_curve_data(s.data, task, s.test_size, s.judge) for task in s.tasks}
    units = [(task, seed, order) for task in s.tasks for seed in s.seeds for order in s.orders]
    todo = [u for u in units if not _unit_done(records, u, _unit_series(s, u[2], baselines), s.rounds)]
    run = {
        "command": s.command,
        "hardware": hardware(),
        # the backbone's weights' dtype, in the service and the baselines ($OPENBOOK_DTYPE, else the device's)
        "dtype": str(resolve_dtype(default_dtype(), s.device)).removeprefix("torch."),
        "source": source(Path(s.out)),
        "backbone": s.backbone,
        "settings": {k: v for k, v in asdict(s).items() if k not in ("data", "out", "command")}
        | {
            "baselines": baselines,
            "method_config": method_config(s.method),
            "peer_configs": peer_configs_of(baselines),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "units": [list(u) for u in todo],
        "seconds": 0.0,
    }
    if not todo:
        say(f"every (task, seed, order) asked for is in {s.out}/results.json already")
    else:
        runs.append(run)
        records = _run_units(s, todo, data, baselines, runs, records, progress)
    for line in target_lines(check_target(records)):
        say(line)
    return records


def run_in_processes(
    s: CurveSettings, argv: Sequence[str], parallel: int, *, say: Callable[[str], None] = print
) -> list[CurveRecord]:
    """`run_learning_curve` with each (task, seed, order) not yet complete in `s.out` run as its own
    `python -m research learning-curve` process (`argv`, the grid's arguments, with the unit's own),
    `parallel` at a time, into `s.out/units/<unit>/`; each unit that ends is merged into `s.out` at once
    (and its directory removed), so a grid stopped midway keeps every finished unit and resumes with the
    others.
    Returns all the records; UnitsFailed (a ValueError) naming the logs of units that failed."""
    from research.parallel import Unit, run_units, unit_argv

    baselines = [name for name in s.baselines if name not in unavailable(s.baselines)]
    runs, records = read_results(s.out)
    check_same_setup(s, runs)
    for task in s.tasks:  # all data checked before a process starts
        load_curve_data(s.data, task, s.test_size, s.judge)
    todo: dict[str, tuple[tuple[str, int, str], Path]] = {}  # unit name: (task, seed, order), its --out
    units = []
    for key in [(task, seed, order) for task in s.tasks for seed in s.seeds for order in s.orders]:
        if _unit_done(records, key, _unit_series(s, key[2], baselines), s.rounds):
            continue
        task, seed, order = key
        name = f"{task}-{seed}-{order}"
        todo[name] = key, Path(s.out) / "units" / name
        options = {"--task": task, "--seeds": str(seed), "--orders": order, "--out": str(todo[name][1])}
        units.append(Unit(name, unit_argv(argv, options)))

    def merge(unit: Unit) -> None:
        key, directory = todo[unit.name]
        out_runs, out_records = read_results(s.out)
        # a partial unit run serially: the series the unit's process recorded afresh
        ran = _unit_series(s, key[2], baselines)
        kept = [r for r in out_records if (r.task, r.seed, r.order) != key or r.method not in ran]
        if len(kept) < len(out_records):
            write_results(s.out, out_runs, kept)
        merge_results(Path(s.out), [directory])
        shutil.rmtree(directory)
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # `units/`, once empty

    if not todo:
        say(f"every (task, seed, order) asked for is in {s.out}/results.json already")
    run_units(units, Path(s.out) / "logs", parallel, done=merge)
    _, records = read_results(s.out)
    for line in target_lines(check_target(records)):
        say(line)
    return records


def _run_units(
    s: CurveSettings,
    todo: Sequence[tuple[str, int, str]],
    data: dict[str, CurveData],
    baselines: Sequence[str],
    runs: list[dict],
    records: list[CurveRecord],
    progress: bool,
) -> list[CurveRecord]:
    started = time.perf_counter()
    backbone = load_backbone(BackboneConfig(name=s.backbone, max_length=s.max_length, device=s.device))
    config = TrainConfig(**s.training)
    if s.baselines_only:

        def save(records: list[CurveRecord]) -> None:
            runs[-1]["seconds"] = round(time.perf_counter() - started, 1)
            write_results(s.out, runs, records)

        return _run_baselines(s, todo, data, baselines, records, backbone, config, save, progress=progress)
    computed: dict[str, Baselines] = {}
    with (
        tempfile.TemporaryDirectory(prefix="openbook-curve-") as tmp,
        service_stack(
            Path(tmp),
            backbone=s.backbone,
            max_length=s.max_length,
            device=s.device,
            untrained_gate=s.untrained_gate,
        ) as client,
    ):
        for task, seed, order in tqdm(todo, desc="learning curve", disable=not progress):
            records = [
                r for r in records if (r.task, r.seed, r.order) != (task, seed, order)
            ]  # a partial unit
            spec = s.task_spec(_task_name(task, seed, order), data[task], backbone.kind)
            if order == "fixed" and baselines and task not in computed:
                computed[task] = _baselines(s, backbone, spec, data[task], config)
            rounds = label_and_score(
                client, data[task], spec, seed, order, s.rounds, pool_size=s.pool_size, waiting=s.waiting
            )
            for outcome in tqdm(
                rounds,
                desc=f"{task} seed {seed} {order}",
                total=len(s.rounds),
                leave=False,
                disable=not progress,
            ):
                common = {
                    "task": task,
                    "seed": seed,
                    "order": order,
                    "shots": outcome.shots,
                    "labelled": len(outcome.ids),
                }
                records.append(
                    CurveRecord(
                        **common,
                        method=SERVICE,
                        accuracy=outcome.accuracy,
                        seconds=outcome.seconds,
                        service=outcome.service,
                    )
                )
                line = [f"service {100 * outcome.accuracy:.1f} ({outcome.service['verdict']})"]
                for baseline in baselines if order == "fixed" else []:
                    records.append(_baseline_round(computed[task], baseline, common, outcome.ids))
                    line.append(f"{baseline} {100 * records[-1].accuracy:.1f}")
                runs[-1]["seconds"] = round(time.perf_counter() - started, 1)
                write_results(s.out, runs, records)
                if progress:
                    tqdm.write(f"{task} seed {seed} {order} {outcome.shots}/class: " + ", ".join(line))
    return records


def _task_name(task: str, seed: int, order: str) -> str:
    """The service task a unit labels."""
    return re.sub(r"[^a-z0-9-]", "", f"{task}-{seed}-{order}".lower())


def _baselines(
    s: CurveSettings, backbone: Backbone, spec: dict, data: CurveData, config: TrainConfig
) -> Baselines:
    task = TaskCreate.model_validate(spec).as_task(s.backbone, NO_READER)  # as the service creates it
    return Baselines(backbone, task, data, config, device=s.device)


def _baseline_round(computed: Baselines, baseline: str, common: dict, ids: Sequence[int]) -> CurveRecord:
    """A baseline's record of a round, trained from scratch on the round's labelled examples `ids`."""
    started = time.perf_counter()
    accuracy = computed.accuracy(baseline, ids, common["seed"])
    seconds = round(time.perf_counter() - started, 3)
    return CurveRecord(**common, method=baseline, accuracy=accuracy, seconds=seconds)


def _run_baselines(
    s: CurveSettings, todo: Sequence[tuple[str, int, str]], data: dict[str, CurveData],
    baselines: Sequence[str], records: list[CurveRecord], backbone: Backbone, config: TrainConfig,
    save: Callable[[list[CurveRecord]], None], *, progress: bool,
) -> list[CurveRecord]:  # fmt: skip
    """The fixed order's baselines alone, no service: each round's labelled examples are the ones the
    service is given (`fixed_rounds`, fixed by the seed), so a baseline can join a curve already recorded.
    The unit's other series stay as they are; a round a baseline has is not run again."""
    computed: dict[str, Baselines] = {}
    for task, seed, order in tqdm(todo, desc="baselines", disable=not progress):
        if task not in computed:
            spec = s.task_spec(_task_name(task, seed, order), data[task], backbone.kind)
            computed[task] = _baselines(s, backbone, spec, data[task], config)
        have = {(r.method, r.shots) for r in records if (r.task, r.seed, r.order) == (task, seed, order)}
        labelled: list[int] = []
        for shots, added in zip(s.rounds, fixed_rounds(data[task].train, seed, s.rounds), strict=True):
            labelled += added
            common = {"task": task, "seed": seed, "order": order, "shots": shots, "labelled": len(labelled)}
            for baseline in baselines:
                if (baseline, shots) in have:
                    continue
                records.append(_baseline_round(computed[task], baseline, common, labelled))
                save(records)
                if progress:
                    accuracy = 100 * records[-1].accuracy
                    tqdm.write(f"{task} seed {seed} {shots}/class: {baseline} {accuracy:.1f}")
    return records
