"""A grid's units as parallel processes: `python -m research eval --parallel N`, `python -m research
learning-curve --parallel N`.

A grid splits into units (a (task, seed) of an evaluation, a (task, seed, order) of a learning curve).
Each unit runs as its own `python -m research` process, with the grid's command but the unit's own
options, and skips what its output already holds, so a grid stopped midway resumes where it was. N
processes share the machine's cores (each gets cores / N threads) or one GPU; the parent shows the units
done, keeps each unit's output in a log, hands each unit that ends well to the caller (to merge its
results, say) as it ends, and fails if any unit failed, naming its log.

`python -m research eval`'s units share one `--out`: the results directory takes records from several
processes at once (`experiments/reports.py`: a lock, and the file read again before each record is added).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root, which holds research/


class UnitsFailed(ValueError):
    """Some units of a grid ended with an error (the commands' user errors are ValueErrors)."""


@dataclass(frozen=True)
class Unit:
    name: str  # the log's name: `<name>.log`
    argv: list[str]  # the `python -m research` arguments that run it


def unit_argv(argv: Sequence[str], options: Mapping[str, str]) -> list[str]:
    """The grid's arguments for one unit: `options` (e.g. {"--task": "trec", "--seeds": "13"}) in place
    of the grid's own values of them, and no --parallel."""
    dropped = {*options, "--parallel"}
    kept: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token.split("=", 1)[0] in dropped:
            skip = "=" not in token  # `--task X` takes the next token too; `--task=X` does not
            continue
        kept.append(token)
    return [*kept, *(token for option in options.items() for token in option)]


def run_units(
    units: Sequence[Unit],
    logs: str | Path,
    parallel: int,
    *,
    module: str = "research",
    done: Callable[[Unit], None] | None = None,
) -> None:
    """Run each unit as `python -m <module> <unit.argv>`, at most `parallel` at a time, its output in
    `logs/<unit.name>.log`; `done(unit)` as each one ends well. UnitsFailed naming the logs of the
    units that failed, after every unit has run. The checkout is on the units' PYTHONPATH, so `research`
    (which is not installed) imports whatever their working directory."""
    logs = Path(logs)
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(max(1, (os.cpu_count() or 1) // parallel))
    path = os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": path}
    pending = list(units)
    running: dict[subprocess.Popen, tuple[Unit, Path]] = {}
    failed: list[Path] = []
    with tqdm(total=len(units), desc=f"units ({parallel} at a time)", unit="unit") as bar:
        while pending or running:
            while pending and len(running) < parallel:
                unit = pending.pop(0)
                log = logs / f"{unit.name}.log"
                command = [sys.executable, "-m", module, *unit.argv]
                with open(log, "w") as handle:
                    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
                running[process] = (unit, log)
            finished = _wait_any(running)
            unit, log = running.pop(finished)
            if finished.returncode != 0:
                failed.append(log)
            elif done is not None:
                done(unit)
            bar.update(1)
    if failed:
        raise UnitsFailed(f"{len(failed)} of {len(units)} units failed; see {', '.join(map(str, failed))}")


def _wait_any(running: Mapping[subprocess.Popen, object]) -> subprocess.Popen:
    """The first of the running processes to end (polled every 0.2 s)."""
    while True:
        for process in running:
            if process.poll() is not None:
                return process
        time.sleep(0.2)
