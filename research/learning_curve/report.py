"""The learning curve's records on disk (results.json, results.md, results.png) and the target check.

A record is one round of one series: the service in one labelling order, or a baseline. Tables and
plots show the mean over seeds per task, and the mean over tasks where every task has the cell. The
target has two parts: per task, on the means over seeds, the service against the baselines
(`check_target`); per task and seed, at every round, what is served against the untrained task on the
same examples (`against_untrained`), the version the loop replaced first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from openbook.atomic import staged_file, write_text

SERVICE = "service"
TARGET_FROM_SHOTS = 8  # the target counts the rounds from this many examples per class on
TARGET_BELOW_BEST = 1.0  # points the service may trail the best baseline at a round
TARGET_OVER_PROMPT_FT = 2.0  # points its mean must lead prompt-ft from scratch by
UNTRAINED = "knn-interp"  # the untrained task: the task's prompt and a store of the same examples
TARGET_BELOW_UNTRAINED = 1.0  # points a served round may trail the untrained task, per task and seed
# Accuracies are ratios of counts, so a gap can sit exactly on a bound; its float may fall a hair short.
TARGET_TOLERANCE = 1e-9


@dataclass(frozen=True)
class CurveRecord:
    task: str
    seed: int
    order: str  # fixed | uncertainty
    method: str  # "service", or a baseline's name
    shots: int  # the round: labelled examples per class
    labelled: int  # examples labelled after the round
    accuracy: float  # on the task's test sample
    seconds: float
    service: dict | None = None  # the service's rounds: versions, gate verdict, jobs, seconds to served

    @property
    def series(self) -> str:
        return self.method if self.order == "fixed" else f"{self.method}/{self.order}"


def read_results(out_dir: str | Path) -> tuple[list[dict], list[CurveRecord]]:
    """(runs, records) of an earlier run in `out_dir`; none if it has no results.json."""
    path = Path(out_dir) / "results.json"
    if not path.exists():
        return [], []
    try:
        document = json.loads(path.read_text())
        return document["runs"], [CurveRecord(**row) for row in document["records"]]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a learning-curve results file: {error}") from None


def write_results(
    out_dir: str | Path, runs: list[dict], records: Sequence[CurveRecord], *, plot: bool = True
) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    document = {"runs": runs, "records": [asdict(r) for r in records]}
    write_text(out / "results.json", json.dumps(document, indent=2) + "\n")
    lines = target_lines(check_target(records), against_untrained(records))
    write_text(
        out / "results.md",
        curve_tables(records)
        + "\n"
        + "\n".join(f"- {line}" for line in lines)
        + "\n\n"
        + runs_table(runs)
        + "\n",
    )
    if plot and records:
        plot_curves(records, out / "results.png")


def _series_rank(series: str) -> int:
    """Where a series stands among the columns: the service, then the baselines, then the service in
    other labelling orders."""
    return 0 if series == SERVICE else 2 if _in_another_order(series) else 1


def _in_another_order(series: str) -> bool:
    """The service in a labelling order but the fixed one (`service/uncertainty`). Only the service runs
    in other orders: a baseline's name may hold a slash of its own (`setfit/encoder=minilm`)."""
    return series.startswith(f"{SERVICE}/")


def seed_means(records: Sequence[CurveRecord]) -> dict[str, dict[str, dict[int, float]]]:
    """task -> series -> shots -> accuracy in %, the mean over seeds. Tasks come in the order records
    came; series in `_series_rank`'s order, then in the order records came, whatever order the units
    were merged in, so each task's table and panel lists the series alike."""
    groups: dict[str, dict[str, dict[int, list[float]]]] = {}
    for r in records:
        groups.setdefault(r.task, {}).setdefault(r.series, {}).setdefault(r.shots, []).append(
            100 * r.accuracy
        )
    return {
        task: {
            series: {shots: float(np.mean(accs)) for shots, accs in sorted(by_shots.items())}
            for series, by_shots in sorted(by_series.items(), key=lambda item: _series_rank(item[0]))
        }
        for task, by_series in groups.items()
    }


def task_mean(means: dict[str, dict[str, dict[int, float]]]) -> dict[str, dict[int, float]]:
    """series -> shots -> the mean over tasks, for the cells every task has."""
    tasks = list(means.values())
    series = dict.fromkeys(s for by_series in tasks for s in by_series)
    result: dict[str, dict[int, float]] = {}
    for s in series:
        shots = sorted(set.intersection(*(set(by_series.get(s, {})) for by_series in tasks)))
        if shots:
            result[s] = {n: float(np.mean([by_series[s][n] for by_series in tasks])) for n in shots}
    return result


def _table(by_series: dict[str, dict[int, float]]) -> list[str]:
    series = list(by_series)
    shots = sorted({n for by_shots in by_series.values() for n in by_shots})
    lines = ["| examples per class | " + " | ".join(series) + " |", "|---" * (len(series) + 1) + "|"]
    for n in shots:
        cells = [f"{by_series[s][n]:.1f}" if n in by_series[s] else "" for s in series]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def curve_tables(records: Sequence[CurveRecord]) -> str:
    """Markdown: per task, rounds x series (test accuracy in %, mean over seeds); then the mean over tasks;
    then the service's rounds: seconds from the last POST to the new version answering, and verdicts."""
    means = seed_means(records)
    lines = []
    for task, by_series in means.items():
        seeds = sorted({r.seed for r in records if r.task == task})
        lines += [f"### {task} (seeds {', '.join(map(str, seeds))})", "", *_table(by_series), ""]
    if len(means) > 1:
        lines += ["### mean over tasks", "", *_table(task_mean(means)), ""]
    seeds_of = {task: sorted({r.seed for r in records if r.task == task}) for task in means}
    for task, seeds in seeds_of.items():  # each seed's own rounds, where the means above mix several
        for seed in seeds if len(seeds) > 1 else []:
            one = seed_means([r for r in records if (r.task, r.seed) == (task, seed)])[task]
            lines += [f"### {task}, seed {seed}", "", *_table(one), ""]
    served: dict[tuple[str, str, int], list[dict]] = {}  # the service's rounds by task, order and shots
    for r in records:
        if r.service is not None:
            served.setdefault((r.task, r.order, r.shots), []).append(r.service)
    if served:
        lines += [
            "### the service's rounds",
            "",
            "| task | order | examples per class | seconds to served (mean) | verdicts | jobs per round "
            "| gate: candidate vs serving dev accuracy (dev examples) | served, prompt / book alone (mean) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        tasks = list(means)
        in_order = sorted(served, key=lambda key: (tasks.index(key[0]), key[1] != "fixed", key[1], key[2]))
        for task, order, shots in in_order:  # per task the fixed order first, whatever order units merged
            rounds = served[(task, order, shots)]
            times = [s["seconds_to_served"] for s in rounds if s["seconds_to_served"] is not None]
            # per seed, each job's verdict and gate in the order the jobs ran: a round's later job can be
            # rejected after an earlier one was promoted, and the promoted version then serves
            verdicts = ", ".join(_verdicts(s) for s in rounds)
            jobs = ", ".join(str(len(s["jobs"])) for s in rounds)
            gates = ", ".join(_gate(s) for s in rounds)
            mean_time = f"{np.mean(times):.1f}" if times else "never"
            cells = [task, order, str(shots), mean_time, verdicts, jobs, gates, _alone(rounds)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines + untrained_table(against_untrained(records)))


def _alone(rounds: Sequence[dict]) -> str:
    """Each reader of the served version alone on the test sample, in %, the mean over seeds: "-" for
    rounds recorded before it was, or a reader with nothing to read (no book before the first example)."""

    def mean(reader: str) -> str:
        accs = [s.get("alone", {}).get(reader) for s in rounds]
        return "-" if None in accs else f"{100 * np.mean(accs):.1f}"

    return f"{mean('prompt')} / {mean('book')}"


def _verdicts(service: dict) -> str:
    """The round's jobs' gate verdicts in turn ("promoted then rejected"); the round's own where the
    jobs carry none."""
    each = [str(job["verdict"]) for job in service["jobs"] if job.get("verdict")]
    return " then ".join(each) if each else str(service["verdict"])


def _gate(service: dict) -> str:
    """The round's jobs' gates in turn, each "candidate vs serving (dev examples)"; "-" where none was
    judged."""
    gates = [job["gate"] for job in service["jobs"] if job.get("gate")]
    return " then ".join(_scores(gate) for gate in gates) if gates else "-"


def _scores(gate: dict) -> str:
    candidate, serving = (
        "-" if gate.get(key) is None else f"{gate[key]:.2f}" for key in ("candidate", "serving")
    )
    return f"{candidate} vs {serving} ({gate['dev']})"


def _code(source: dict | None) -> str:
    """A run's `source` as a table cell: the version, and the commit where known."""
    if not source:
        return "not recorded"
    if not source.get("commit"):
        return source["openbook"]
    changes = " with uncommitted changes" if source.get("dirty") else ""
    return f"{source['openbook']}, {source['commit'][:10]}{changes}"


def runs_table(runs: Sequence[dict]) -> str:
    """Markdown: each run of the command, with what it ran, how long, and the code that ran it."""
    lines = ["### runs", "", "| started | (task, seed, order) to run | hours | code |", "|---|---|---|---|"]
    for run in runs:
        units = "; ".join(" ".join(map(str, unit)) for unit in run.get("units", []))
        hours = run.get("seconds", 0) / 3600
        lines.append(f"| {run.get('started', '')} | {units} | {hours:.2f} | {_code(run.get('source'))} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class TaskTarget:
    task: str
    holds: bool | None  # None: the records cannot tell (no service or prompt-ft rounds from 8 on)
    worst_gap: float | None  # the service minus the best baseline, at its worst round
    worst_shots: int | None
    over_prompt_ft: float | None  # the service's mean over every round minus prompt-ft's


def check_target(records: Sequence[CurveRecord]) -> list[TaskTarget]:
    """Per task, on the means over seeds of the fixed order (the baselines' examples): from
    TARGET_FROM_SHOTS examples per class on, the service is never more than TARGET_BELOW_BEST points
    below the best baseline at a round, and its mean over every round is at least
    TARGET_OVER_PROMPT_FT points above prompt-ft's."""
    targets = []
    for task, by_series in seed_means(records).items():
        every = by_series.get(SERVICE, {})
        baselines = {s: v for s, v in by_series.items() if s != SERVICE and not _in_another_order(s)}
        compared = [n for n in every if "prompt-ft" in baselines and n in baselines["prompt-ft"]]
        rounds = [n for n in compared if n >= TARGET_FROM_SHOTS]
        if not rounds:
            targets.append(TaskTarget(task, None, None, None, None))
            continue
        gaps = {n: every[n] - max(v[n] for v in baselines.values() if n in v) for n in rounds}
        worst = min(gaps, key=gaps.__getitem__)
        lead = float(
            np.mean([every[n] for n in compared]) - np.mean([baselines["prompt-ft"][n] for n in compared])
        )
        holds = (
            gaps[worst] >= -TARGET_BELOW_BEST - TARGET_TOLERANCE
            and lead >= TARGET_OVER_PROMPT_FT - TARGET_TOLERANCE
        )
        targets.append(TaskTarget(task, holds, gaps[worst], worst, lead))
    return targets


@dataclass(frozen=True)
class UntrainedRound:
    """A round of one task and seed, the fixed order: what is served against the untrained task (in %)."""

    task: str
    seed: int
    shots: int
    served: float
    untrained: float
    first: bool  # the task's first version was served from this round on

    @property
    def gap(self) -> float:
        return self.served - self.untrained


def _first_version(service: dict) -> bool:
    """Whether a round's jobs served the task's first version (the round's own verdict where its jobs
    carry none)."""
    verdicts = [job.get("verdict") for job in service.get("jobs", []) if job.get("verdict")]
    return "first" in (verdicts or [service.get("verdict")])


def against_untrained(records: Sequence[CurveRecord]) -> list[UntrainedRound]:
    """The service's fixed-order rounds that have the untrained task's record on the same examples."""
    untrained = {
        (r.task, r.seed, r.shots): r for r in records if r.order == "fixed" and r.method == UNTRAINED
    }
    return [
        UntrainedRound(
            r.task,
            r.seed,
            r.shots,
            100 * r.accuracy,
            100 * untrained[key].accuracy,
            _first_version(r.service),
        )
        for r in records
        if r.order == "fixed"
        and r.method == SERVICE
        and r.service is not None
        and (key := (r.task, r.seed, r.shots)) in untrained
    ]


def _below_untrained(rounds: Sequence[UntrainedRound]) -> list[UntrainedRound]:
    return [r for r in rounds if r.gap < -TARGET_BELOW_UNTRAINED - TARGET_TOLERANCE]


def untrained_table(rounds: Sequence[UntrainedRound]) -> list[str]:
    """Markdown: per task and seed, the first version against the untrained task, and what is served
    minus the untrained task at every round (bold: more than TARGET_BELOW_UNTRAINED below)."""
    if not rounds:
        return []
    lines = [
        "### what is served against the untrained task (knn-interp on the same examples)",
        "",
        "| task, seed | first version: per class, served vs untrained | served minus untrained, per round |",
        "|---|---|---|",
    ]
    below = _below_untrained(rounds)
    for task, seed in dict.fromkeys((r.task, r.seed) for r in rounds):
        own = sorted((r for r in rounds if (r.task, r.seed) == (task, seed)), key=lambda r: r.shots)
        firsts = [f"{r.shots}: {r.served:.1f} vs {r.untrained:.1f}" for r in own if r.first]
        gaps = [f"**{r.gap:+.1f}**" if r in below else f"{r.gap:+.1f}" for r in own]
        cells = ", ".join(f"{r.shots}: {gap}" for r, gap in zip(own, gaps, strict=True))
        lines.append(f"| {task}, {seed} | {'; '.join(firsts) or 'none'} | {cells} |")
    return [*lines, ""]


def untrained_line(rounds: Sequence[UntrainedRound]) -> str:
    """The target's part against the untrained task, over `rounds` (at least one)."""
    below = _below_untrained(rounds)
    worst = min(rounds, key=lambda r: r.gap)
    return (
        f"against the untrained task: target {'missed' if below else 'holds'}: {len(below)} of {len(rounds)}"
        f" rounds served more than {TARGET_BELOW_UNTRAINED:.0f} point below it, at worst {worst.gap:+.1f}"
        f" ({worst.task} seed {worst.seed}, {worst.shots} per class)"
    )


def target_lines(targets: Sequence[TaskTarget], untrained: Sequence[UntrainedRound] = ()) -> list[str]:
    """The target's lines: per task against the baselines, then, with `untrained` rounds, against the
    untrained task; the target over all tasks holds when every checked part does."""
    lines = []
    for t in targets:
        if t.holds is None:
            lines.append(
                f"{t.task}: target not checked (no service and prompt-ft rounds from {TARGET_FROM_SHOTS} on)"
            )
            continue
        lines.append(
            f"{t.task}: target {'holds' if t.holds else 'missed'}: at worst {t.worst_gap:+.1f} points"
            f" against the best baseline ({t.worst_shots} per class; at least -{TARGET_BELOW_BEST:.0f}"
            f" wanted), mean {t.over_prompt_ft:+.1f} points over prompt-ft from scratch (at least"
            f" +{TARGET_OVER_PROMPT_FT:.0f} wanted)"
        )
    checked = [t.holds for t in targets if t.holds is not None]
    if untrained:
        lines.append(untrained_line(untrained))
        checked.append(not _below_untrained(untrained))
    if checked:
        lines.append(f"target over all tasks: {'holds' if all(checked) else 'missed'}")
    return lines


def series_colours(means: dict[str, dict[str, dict[int, float]]]) -> dict[str, str]:
    """One colour per series over every panel, since one legend names them all."""
    names = sorted(dict.fromkeys(s for by_series in means.values() for s in by_series), key=_series_rank)
    return {series: f"C{i % 10}" for i, series in enumerate(names)}


def plot_curves(records: Sequence[CurveRecord], path: Path) -> None:
    """One panel per task: accuracy (mean over seeds) against labelled examples per class, a line a series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = seed_means(records)
    colours = series_colours(means)
    figure, axes = plt.subplots(1, len(means), figsize=(4.5 * len(means), 3.8), squeeze=False)
    for panel, (task, by_series) in zip(axes[0], means.items(), strict=True):
        for series, by_shots in by_series.items():
            style = "-" if series.startswith(SERVICE) else "--"
            panel.plot(
                list(by_shots),
                list(by_shots.values()),
                style,
                marker="o",
                color=colours[series],
                label=series,
            )
        panel.set_xscale("log", base=2)
        rounds = sorted({n for by_shots in by_series.values() for n in by_shots})
        panel.set_xticks(rounds, [str(n) for n in rounds])  # the rounds themselves, not powers of 2
        panel.minorticks_off()
        panel.set_title(task)
        panel.set_xlabel("labelled examples per class")
        panel.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy (%), mean over seeds")
    lines = {line.get_label(): line for panel in axes[0] for line in panel.get_lines()}  # a handle a series
    axes[0][-1].legend(handles=[lines[s] for s in colours if s in lines], fontsize="small")
    figure.tight_layout()
    with staged_file(path) as staging:
        figure.savefig(staging, format="png", dpi=120)
    plt.close(figure)
