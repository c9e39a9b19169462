"""A grid's units as parallel processes: `openbook eval --parallel N`.

An evaluation grid splits into units, one (task, seed) each. Each unit runs as its own `openbook eval`
process on the same `--out`: the results directory takes records from several processes at once
(`experiments/reports.py`: a lock, and the file read again before each record is added), and a unit
skips the runs already there, so a grid stopped midway resumes where it was. N processes share the
machine's cores (each gets cores / N threads) or one GPU; the parent shows the units done, keeps each
unit's output in `OUT/logs/`, and fails if any unit failed, naming its log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

# The options a unit's command sets itself; the rest of the grid's command is passed on as it is.
_UNIT_OPTIONS = ("--task", "--seeds", "--parallel")


class UnitsFailed(ValueError):
    """Some units of a grid ended with an error (the command's user errors are ValueErrors)."""


def unit_argv(argv: Sequence[str], task: str, seed: int) -> list[str]:
    """The grid's `eval` arguments for one unit: its task and seed, and no --parallel."""
    kept: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _UNIT_OPTIONS:
            skip = "=" not in token  # `--task X` takes the next token too; `--task=X` does not
            continue
        kept.append(token)
    return [*kept, "--task", task, "--seeds", str(seed)]


def run_units(argv: Sequence[str], units: Sequence[tuple[str, int]], out: str | Path, parallel: int) -> None:
    """Run `openbook eval` once per (task, seed) unit, at most `parallel` at a time; UnitsFailed naming
    the logs of the units that failed, after every unit has run."""
    logs = Path(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    threads = str(max(1, (os.cpu_count() or 1) // parallel))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    pending = list(units)
    running: dict[subprocess.Popen, Path] = {}
    failed: list[Path] = []
    with tqdm(total=len(units), desc=f"eval units ({parallel} at a time)", unit="unit") as bar:
        while pending or running:
            while pending and len(running) < parallel:
                task, seed = pending.pop(0)
                log = logs / f"{task}-{seed}.log"
                command = [sys.executable, "-m", "openbook.cli", *unit_argv(argv, task, seed)]
                with open(log, "w") as handle:
                    running[subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)] = log
            finished = _wait_any(running)
            log = running.pop(finished)
            if finished.returncode != 0:
                failed.append(log)
            bar.update(1)
    if failed:
        raise UnitsFailed(f"{len(failed)} of {len(units)} units failed; see {', '.join(map(str, failed))}")


def _wait_any(running: dict[subprocess.Popen, Path]) -> subprocess.Popen:
    """The first of the running processes to end (polled every 0.2 s)."""
    while True:
        for process in running:
            if process.poll() is not None:
                return process
        time.sleep(0.2)
