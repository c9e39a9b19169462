"""Which records a learning-curve directory may take: the setup a run's records measure, checked before a
run adds to a directory (`check_same_setup`), when units run apart are merged (`merge_results`), and the
SetFit baselines named by what they ran (`relabel_curve`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from openbook.methods import method_config

from research import PROG
from research.experiments.setfit_peer import is_peer, peer_config, recorded_peer_spec
from research.learning_curve.report import CurveRecord, read_results, write_results
from research.learning_curve.settings import CurveSettings

# Settings that change what a record measures: records made under other ones are not added to.
SAME_SETUP = ("backbone", "test_size", "pool_size", "training", "max_length")


def _setup(settings: dict) -> dict:
    """What the records of a run made with `settings` (as results.json holds them) measure: the SAME_SETUP
    keys, the method's every option and each SetFit baseline's (`baseline <name>`). A run of baselines
    alone measures only what its baselines depend on (`_baseline_keys`)."""
    setup = (
        {key: _plain(settings.get(key)) for key in SAME_SETUP}
        # added later: a run recorded before either ran without the gate, on test
        | {"untrained_gate": bool(settings.get("untrained_gate")), "judge": settings.get("judge")}
        | {"reader": settings.get("reader")}  # added later still: a run recorded before had none
        | {"method": _plain(settings["method_config"])}
        | {
            f"baseline {name}": _plain(settings["peer_configs"][name])
            for name in settings.get("baselines", [])
            if is_peer(name)
        }
    )
    if settings.get("baselines_only"):
        keys = _baseline_keys(settings.get("baselines", []))
        return {key: value for key, value in setup.items() if key in keys}
    return setup


def _baseline_keys(baselines: Sequence[str]) -> set[str]:
    """The setup keys the baselines' records depend on: the scored sample (`test_size`, `judge`); the
    backbone for the ones it runs, and the service's training settings for prompt-ft, which trains as a
    job does; the untrained task's reader; a SetFit baseline's own options alone. The service's method,
    gate and pool are not among them: a SetFit baseline can join a curve whose service ran under another
    budget, and prompt-ft one whose service reads with a sentence reader."""
    keys = {"test_size", "judge"}
    for name in baselines:
        if is_peer(name):
            keys.add(f"baseline {name}")
        elif name == "prompt-ft":  # the prompt alone, trained as a job trains, with no sentence reader
            keys |= {"backbone", "max_length", "training"}
        else:  # the untrained task: the service's, its book read by the reader where it has one
            keys |= {"backbone", "max_length", "reader"}
    return keys


def peer_configs_of(baselines: Sequence[str]) -> dict[str, dict]:
    """Each SetFit baseline's every option, as a run records them."""
    return {name: asdict(peer_config(name)) for name in baselines if is_peer(name)}


def _differing(ours: dict, theirs: dict) -> list[str]:
    """The setup keys both runs have on which they differ (one run may lack a baseline the other ran)."""
    return sorted(key for key in ours if key in theirs and ours[key] != theirs[key])


def check_same_setup(s: CurveSettings, runs: Sequence[dict]) -> None:
    """ValueError if `s.out` holds records of another backbone, method, scoring setup or SetFit baseline
    than `s`'s."""
    ours = _setup(
        {key: getattr(s, key) for key in (*SAME_SETUP, "untrained_gate", "judge", "baselines_only", "reader")}
        | {
            "method_config": method_config(s.method),
            "baselines": list(s.baselines),
            "peer_configs": peer_configs_of(s.baselines),
        }
    )
    for run in runs:
        theirs = _setup(run["settings"])
        differ = _differing(ours, theirs)
        if differ:
            raise ValueError(
                f"{s.out}/results.json holds records made with other settings ({', '.join(differ)}: "
                f"{', '.join(f'{k}={theirs[k]}' for k in differ)}); give another --out"
            )


def merge_results(out: Path, sources: Sequence[Path]) -> list[CurveRecord]:
    """Gather into `out` the runs and records of `sources`, beside any already in `out`: units run as
    separate processes (or on separate machines), each into its own directory, become one curve.

    ValueError, with nothing written, if a source holds no results, if the runs differ in setup
    (`check_same_setup`'s keys), or if a (task, seed, order, series, round) is recorded twice.
    """
    runs, records = read_results(out)
    for directory in sources:
        their_runs, their_records = read_results(directory)
        if not their_runs:
            raise ValueError(f"{directory} holds no learning-curve results")
        runs, records = [*runs, *their_runs], [*records, *their_records]
    if not runs:
        raise ValueError("nothing to merge: no output directory given")
    first = _setup(runs[0]["settings"])
    for run in runs[1:]:
        differ = _differing(first, _setup(run["settings"]))
        if differ:
            raise ValueError(f"the runs to merge differ in {', '.join(differ)}: {run['command']}")
    counts = Counter((r.task, r.seed, r.order, r.method, r.shots) for r in records)
    twice = sorted(key for key, n in counts.items() if n > 1)
    if twice:
        raise ValueError(f"recorded more than once (task, seed, order, series, round): {twice[:5]}")
    write_results(out, runs, records)
    return records


def copy_baselines(out: Path, source: Path, names: Sequence[str]) -> list[CurveRecord]:
    """Add to `out` the records of the baselines `names` that `source` holds for `out`'s own tasks, seeds
    and rounds, each as a run of that baseline alone: a baseline that does not depend on what differs
    between the two curves (prompt-ft, SetFit) need not train again. Each copied run keeps the command,
    hardware and settings of the `source` run that recorded the baseline, and says where it came from.

    ValueError, with nothing written, if `out` or `source` holds no curve, if a baseline's setup differs
    between them (`_baseline_keys`: the untrained task's reader, prompt-ft's training, SetFit's options as
    they are today), if `source` lacks a round of `out`'s grid, or if `out` has one of the records (a
    baseline copied before, its records the same, is left as it is)."""
    runs, records = read_results(out)
    their_runs, their_records = read_results(source)
    if not runs or not their_runs:
        raise ValueError(f"{out if not runs else source} holds no learning-curve results")
    grid = {(r.task, r.seed, r.shots) for r in records if r.order == "fixed"}
    have = {(r.task, r.seed, r.order, r.method, r.shots) for r in records}
    new_runs, copied = [], []
    for name in names:
        origins = [run for run in their_runs if name in run["settings"].get("baselines", [])]
        if not origins:
            raise ValueError(f"{source} recorded no {name} baseline")
        mine = [
            r
            for r in their_records
            if r.method == name and r.order == "fixed" and (r.task, r.seed, r.shots) in grid
        ]
        missing = sorted(grid - {(r.task, r.seed, r.shots) for r in mine})
        if missing:
            raise ValueError(
                f"{source} lacks {name} rounds of {out}'s grid (task, seed, round): {missing[:5]}"
            )
        today = {"baselines": [name], "peer_configs": peer_configs_of([name]), "baselines_only": True}
        run = _plain(
            origins[-1]
            | {
                "command": f"copied from {source} by `{PROG} learning-curve --out {out} --baselines-from "
                f"{source} --baselines {name}`; made by: {origins[-1]['command']}",
                "settings": origins[-1]["settings"] | {"baselines": [name], "baselines_only": True},
                "units": sorted({(r.task, r.seed, r.order) for r in mine}),
            }
        )
        assert isinstance(run, dict)
        differ = _differing(_setup(runs[0]["settings"] | today), _setup(run["settings"]))
        if differ:
            raise ValueError(f"{source}'s {name} ran with other settings than {out}'s: {', '.join(differ)}")
        twice = sorted(key for r in mine if (key := (r.task, r.seed, r.order, r.method, r.shots)) in have)
        if len(twice) == len(mine) and all(r in records for r in mine):
            continue  # copied before: the same records
        if twice:
            raise ValueError(
                f"{out} has these records already (task, seed, order, series, round): {twice[:5]}"
            )
        new_runs.append(run)
        copied += mine
    write_results(out, [*runs, *new_runs], [*records, *copied])
    return copied


def relabel_curve(out: Path) -> dict[str, str]:
    """Name each SetFit baseline of `out` by the options its runs recorded, under today's defaults
    (`setfit_peer.recorded_peer_spec`), in the records and the runs' settings: a baseline recorded as
    `setfit` when the peer's encoder was all-MiniLM-L6-v2 becomes `setfit/encoder=minilm/max-steps=0`,
    and today's `setfit` can join the curve beside it. The renames made, old name -> new; ValueError,
    with nothing written, where one name stands for runs of different options."""
    runs, records = read_results(out)
    if not runs:
        raise ValueError(f"{out} holds no learning-curve results")
    renames: dict[str, str] = {}
    for run in runs:
        for name, recorded in run["settings"].get("peer_configs", {}).items():
            new = recorded_peer_spec(recorded)
            if renames.setdefault(name, new) != new:
                raise ValueError(f"{out}: {name} names runs of different options ({renames[name]}, {new})")
    renames = {old: new for old, new in renames.items() if old != new}
    if renames:
        for run in runs:
            settings = run["settings"]
            settings["baselines"] = [renames.get(name, name) for name in settings.get("baselines", [])]
            if "peer_configs" in settings:
                settings["peer_configs"] = {renames.get(k, k): v for k, v in settings["peer_configs"].items()}
        renamed = [replace(r, method=renames.get(r.method, r.method)) for r in records]
        write_results(out, runs, renamed)
    return renames


def _plain(value: object) -> object:
    """Lists for tuples, as a value read back from JSON has them."""
    return json.loads(json.dumps(value))
