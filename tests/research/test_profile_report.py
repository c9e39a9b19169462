"""The profile summary counts the served path's samples by stage, and nothing else."""

from pathlib import Path

from research.cli import main
from research.profile_report import summarise

LOOP = "thread (1): Thread-1 (run);RequestResponseCycle.run_asgi (uvicorn/h.py:1)"
WORKER = "thread (2): AnyIO worker thread;WorkerThread.run (anyio/_backends/_asyncio.py:9)"
RAW = [
    f"{LOOP};solve_dependencies (fastapi/dependencies/utils.py:1) 30",
    f"{LOOP};Request.body (starlette/requests.py:2);json (json/__init__.py:3) 10",
    f"{LOOP};LimitBody.__call__ (services/api/middleware.py:4) 20",
    f"{WORKER};TaskRuntime.predict (services/api/tasks.py:5);Classifier.predict (openbook/classifier.py:6)"
    ";Backbone.forward (openbook/backbone.py:7);linear (torch/nn/functional.py:8) 25",
    f"{WORKER};TaskRuntime.predict (services/api/tasks.py:5);Classifier.score (openbook/classifier.py:9) 5",
    f"{WORKER};Runtimes.runtime (services/engine/runtimes.py:10);TaskSpecs.build (specs.py:11) 7",
    "thread (0): MainThread;measure_throughput (services/bench.py:1);Backbone.forward (backbone.py:7) 40",
    "",
]


def test_samples_are_summed_by_the_first_stage_they_reach_and_the_rest_is_left_out() -> None:
    stages, served, total = summarise(RAW)
    assert total == 137
    assert served == 90  # not the bench's own forwards (40), not building a task (7)
    assert stages == {
        "FastAPI: resolving dependencies": 30,
        "request body: read and JSON parse": 10,
        "HTTP server, middleware and routing": 20,
        "model forward": 25,  # inside the prediction, but the forward comes first
        "kNN search and mixture": 5,
    }


def test_the_command_prints_shares(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "profile.txt"
    profile.write_text("\n".join(RAW))
    assert main(["profile-report", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "90 of 137 samples on the served path" in out
    assert " 33.3%  FastAPI: resolving dependencies" in out


def test_a_profile_of_several_processes_is_summed_per_process(tmp_path: Path, capsys) -> None:
    parent = 'process 10:"python -m services.cli serve"'
    replica = f'{parent};process 11:"python -m services.cli serve"'
    front = f'{parent};process 12:"python -c from multiprocessing.spawn import spawn_main; spawn_main()"'
    raw = [f"{replica};{line}" for line in RAW if line] + [
        f"{front};{LOOP};Gatherer.classify (services/api/front.py:83) 6",
        f"{front};{LOOP};HttpToolsProtocol.data_received (uvicorn/protocols/http/httptools_impl.py:1) 2",
        f"{parent};thread (0): MainThread;_supervise (services/cli/serve.py:1) 9",  # nothing served
    ]
    profile = tmp_path / "profile.txt"
    profile.write_text("\n".join(raw))
    assert main(["profile-report", str(profile)]) == 0
    out = capsys.readouterr().out
    replica_at, front_at = out.index("process 11 "), out.index("process 12 ")
    assert replica_at < front_at  # the busiest first
    assert "process 10 " not in out
    assert "90 of 137 samples on the served path" in out[replica_at:front_at]
    assert "6 of 8 samples" not in out and "8 of 8 samples on the served path" in out[front_at:]
    assert " 75.0%  front: gathering, and its client of the replica" in out[front_at:]
