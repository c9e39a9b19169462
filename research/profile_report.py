"""Where the served path's time goes: a py-spy profile of the api, summed by stage.

    py-spy record --gil --rate 200 --format raw --output profile.txt -- \\
        openbook bench api --stand-in --clients 256
    python -m research profile-report profile.txt

With `py-spy record --subprocesses` (fronts before a replica, or several api workers) each sample's stack
begins with its process; `report` then sums each process apart, the busiest first.

`--gil` keeps only the samples of the thread that holds the GIL: one Python process can run one such
thread at a time, so these samples are what bounds its throughput. Each sample on the served path (the
HTTP server's event loop, and the worker threads it hands requests to) counts once, in the first stage
of `STAGES` that one of its frames belongs to, from the model inwards to the HTTP server outwards; the
rest of the process (the bench's own clients and bare forwards, start-up, model loading) is left out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# (stage, the frame names that put a sample in it); the first stage that matches wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model forward", ("Backbone.forward",)),
    ("kNN search and mixture", ("KnowledgeStore.search", "Classifier.score")),
    ("prompt encoding (tokenizer)", ("PromptEncoder.encode", "PromptEncoder.tokenize")),
    (
        "catch-up with the examples log, and the task check (Redis)",
        ("TaskRuntime._apply_log", "ExampleLog.read_with_spec"),
    ),
    ("rest of the prediction (per-text results)", ("TaskRuntime.predict",)),
    ("task lookup: spec and generation (Redis)", ("Runtimes.runtime",)),
    ("FastAPI: resolving dependencies", ("solve_dependencies",)),
    ("request body: read and JSON parse", ("Request.body", "Request.json")),
    ("response: validation and JSON encoding", ("serialize_response", "JSONResponse.render")),
    ("response: sending", ("Response.__call__",)),
    ("front: gathering, and its client of the replica", ("Gatherer.", "Front._upstream")),
    ("endpoint body (checks, micro-batcher)", ("run_endpoint_function", "MicroBatcher.")),
    ("thread hand-offs (anyio)", ("WorkerThread.", "run_sync_in_worker_thread")),
    ("HTTP server, middleware and routing", ("RequestResponseCycle.", "HttpToolsProtocol.")),
)
# Frames that mark a sample as the served path's; and, of those, the ones that are not serving.
SERVED = ("uvicorn/", "WorkerThread.run")
# (`_find_and_load`: importing, as a spawned front process does inside uvicorn's frames)
NOT_SERVING = (
    "TaskSpecs.build",
    "_load_backbone",
    "follow_checkpoints",
    "Server.startup",
    "warm_up",
    "_find_and_load",
)


def _function(frame: str) -> str:
    """`Classifier.embed (openbook/classifier.py:140)` -> `Classifier.embed`."""
    return re.sub(r" \(.*\)$", "", frame)


def summarise(lines: Iterable[str]) -> tuple[Counter[str], int, int]:
    """Samples per stage, the samples on the served path, and all samples, from py-spy's raw lines."""
    stages: Counter[str] = Counter()
    served = total = 0
    for line in lines:
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        samples = int(count)
        total += samples
        frames = stack.split(";")
        if not any(marker in frame for frame in frames for marker in SERVED):
            continue
        functions = [_function(frame) for frame in frames]
        if any(function.startswith(NOT_SERVING) for function in functions):
            continue
        served += samples
        stage = next(
            (name for name, marks in STAGES if any(f.startswith(marks) for f in functions)),
            "other: " + functions[-1],
        )
        stages[stage] += samples
    return stages, served, total


# py-spy's first frame of a sample under --subprocesses: `process 123:"python -m services.cli serve"`
_PROCESS = re.compile(r'process (\d+):"([^"]*)";')


def by_process(lines: Iterable[str]) -> dict[str, list[str]]:
    """py-spy's raw lines by the process they were sampled in (its innermost `process` frame: a child's
    stack begins with its parents'), each line without its process frames; one key, "", without any."""
    processes: dict[str, list[str]] = {}
    for line in lines:
        found = list(_PROCESS.finditer(line))
        name = f"{found[-1].group(1)} {found[-1].group(2)}" if found else ""
        processes.setdefault(name, []).append(line[found[-1].end() :] if found else line)
    return processes


def _table(summary: tuple[Counter[str], int, int], top: int) -> list[str]:
    stages, served, total = summary
    rows = [f"{served} of {total} samples on the served path", "share  stage"]
    return rows + [f"{count / max(served, 1):6.1%}  {stage}" for stage, count in stages.most_common(top)]


def report(path: Path, top: int = 16) -> str:
    with path.open() as lines:
        summaries = {name: summarise(lines) for name, lines in by_process(lines).items()}
    if list(summaries) == [""]:
        return "\n".join(_table(summaries[""], top))
    rows: list[str] = []
    for name, summary in sorted(summaries.items(), key=lambda item: -item[1][1]):
        if summary[1]:  # processes with nothing served (the supervisor, the bench's clients) left out
            rows += ["", f"process {name}", *_table(summary, top)]
    return "\n".join(rows[1:])
