"""`openbook bench learning-curve`: accuracy against labelled examples, as a user of the service lives it.

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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis
import torch
from openbook.backbone import Backbone, BackboneConfig, load_backbone
from openbook.config_fields import default_of
from openbook.devices import default_dtype, resolve_dtype
from openbook.methods import DEFAULT_METHOD, build_method, method_config
from openbook.models import DEFAULT_BACKBONE
from openbook.prompting import get_preset
from openbook.train_config import TrainConfig
from openbook.version import __version__
from tqdm.auto import tqdm

from services.api.settings import Settings
from services.bench_stack import Served
from services.bus.server import EmbeddedRedis, free_port
from services.engine.task_spec import Task
from services.learning_curve.baselines import BASELINES, Baselines, unavailable
from services.learning_curve.client import CurveClient
from services.learning_curve.report import (
    SERVICE,
    CurveRecord,
    check_target,
    read_results,
    target_lines,
    write_results,
)
from services.learning_curve.schedule import (
    ORDERS,
    ROUNDS,
    CurveData,
    check_rounds,
    fixed_rounds,
    load_curve_data,
)
from services.learning_curve.service import Waiting, label_and_score
from services.learning_curve.setup import check_same_setup, merge_results, peer_configs_of
from services.trainer.worker import Worker


@dataclass(frozen=True)
class CurveSettings:
    data: Path  # the full/ directory
    out: Path
    tasks: Sequence[str]
    seeds: Sequence[int]
    backbone: str = DEFAULT_BACKBONE
    rounds: Sequence[int] = ROUNDS
    orders: Sequence[str] = ORDERS
    baselines: Sequence[str] = BASELINES
    method: str = DEFAULT_METHOD  # the service task's method, which its automatic jobs train
    test_size: int | None = 500
    pool_size: int | None = 500  # the uncertainty order's pool (the service scores up to 2000)
    # the service task's training settings, its budget spelled out (by default, the default budget), and
    # the weights its jobs keep
    training: dict = field(
        default_factory=lambda: {
            "batch_size": 8,
            "lr": 1e-5,
            "patience": 2,
            "keep": TrainConfig.keep,
            **TrainConfig().budget(),
        }
    )
    max_length: int = BackboneConfig.max_length
    device: str = field(default_factory=lambda: default_of(BackboneConfig, "device"))
    # the worker's first gate against the untrained task (OPENBOOK_UNTRAINED_GATE in the service)
    untrained_gate: bool = False
    judge: int | None = None  # score on this many held-out training examples instead of test (schedule.py)
    # the fixed order's baselines alone, without the service: a baseline added to a curve already recorded
    baselines_only: bool = False
    waiting: Waiting = field(default_factory=Waiting)
    command: str = ""  # as typed, for the record

    def __post_init__(self) -> None:
        check_rounds(self.rounds)
        unknown = [order for order in self.orders if order not in ORDERS]
        if unknown:
            raise ValueError(f"unknown order(s) {unknown}; known: {', '.join(ORDERS)}")
        if self.baselines_only and (list(self.orders) != ["fixed"] or not self.baselines):
            raise ValueError("baselines alone: give baselines and the fixed order alone, which has them")
        TrainConfig(**self.training)  # bad training settings fail before anything starts
        build_method(self.method)  # and so does an unknown method or option (MethodError)

    def task_spec(self, name: str, data: CurveData, kind: str) -> dict:
        """The service task: the task's preset prompt; an automatic job every smallest round."""
        template, verbalizer = get_preset(data.task).prompt(kind)
        return {
            "name": name,
            "template": template.source,
            "labels": dict(zip(verbalizer.labels, verbalizer.words, strict=True)),
            "method": self.method,
            "training": {"auto": True, "every": self.rounds[0] * len(data.labels), **self.training},
        }


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


@contextlib.contextmanager
def service_stack(
    directory: Path,
    *,
    backbone: str,
    max_length: int = BackboneConfig.max_length,
    device: str | None = None,
    untrained_gate: bool = True,
) -> Iterator[CurveClient]:
    """The embedded Redis, the api on a local port and a worker thread; a client of the api. The device
    and the gate are the service's defaults unless given."""
    device = default_of(BackboneConfig, "device") if device is None else device
    with EmbeddedRedis(directory / "redis") as bus:
        settings = Settings(
            redis_url=bus.url,
            data_dir=directory,
            default_backbone=backbone,
            max_length=max_length,
            device=device,
            port=free_port(),
        )
        served = Served(settings)
        worker = Worker(
            redis.Redis.from_url(bus.url),
            settings.artifacts,
            device=device,
            max_length=max_length,
            untrained_gate=untrained_gate,
        )
        stop = threading.Event()
        training = threading.Thread(target=worker.run_forever, args=(stop,), daemon=True)
        training.start()
        client = CurveClient(served.base, max_batch=settings.max_batch)
        try:
            yield client
        finally:
            client.close()
            stop.set()
            training.join(timeout=120)
            served.stop()


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
    `openbook bench learning-curve` process (`argv`, the grid's arguments, with the unit's own), `parallel`
    at a time, into `s.out/units/<unit>/`; each unit that ends is merged into `s.out` at once (and its
    directory removed), so a grid stopped midway keeps every finished unit and resumes with the others.
    Returns all the records; UnitsFailed (a ValueError) naming the logs of units that failed."""
    from openbook.cli.parallel import Unit, run_units, unit_argv

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
        units.append(Unit(name, ["bench", "learning-curve", *unit_argv(argv, options)]))

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
    run_units(units, Path(s.out) / "logs", parallel, module="services.cli", done=merge)
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
    return Baselines(
        backbone, Task.model_validate({**spec, "backbone": s.backbone}), data, config, device=s.device
    )


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
