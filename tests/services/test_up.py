"""`openbook up` supervises its children: a dead one is restarted, and a crash loop ends with a reason."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.bus.examples_log import ExampleLog, NewExample
from services.bus.server import EmbeddedRedis, free_port
from services.cli.supervisor import RestartPolicy, Supervisor
from services.cli.up import valkey_child
from tests.chaos.stack import TASK, UpStack, wait_until

# Long enough (about 5-10 s on a tiny model and one core) for the worker to be killed in the middle.
LONG_JOB = {"method": "prompt-ft", "steps": 500, "batch_size": 4, "lr": 1e-3, "eval_every": 500}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, causal_dir: Path):
    up = UpStack(tmp_path_factory.mktemp("up"), causal_dir).start()
    try:
        up.wait_ready()
        assert up.http.post("/v1/tasks", json=TASK).status_code == 201
        yield up
    finally:
        code = up.stop()
    assert code == 0, up.log()[-3000:]  # SIGTERM stops the stack cleanly
    assert not up.pids()


def post(stack: UpStack, ids: range) -> None:
    examples = [{"text": f"a {('bad', 'good')[i % 2]} film {i}", "label": str(i % 2), "id": i} for i in ids]
    response = stack.http.post("/v1/tasks/reviews/examples", json={"examples": examples})
    assert response.status_code == 201, response.text


def stored_ids(stack: UpStack) -> set[int]:
    page = stack.http.get("/v1/tasks/reviews/examples", params={"limit": 1000}).json()
    return {example["id"] for example in page["examples"]}


def test_a_second_stack_on_the_same_data_dir_is_refused(stack: UpStack) -> None:
    second = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up"],
        env={**stack.env, "OPENBOOK_PORT": str(free_port())},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so that whatever it starts can be stopped with it
    )
    try:
        output, _ = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        second.communicate()
        raise AssertionError("a second `openbook up` on the same data directory kept running") from None
    assert second.returncode != 0
    assert b"another openbook stack" in output and stack.env["OPENBOOK_DATA_DIR"].encode() in output
    assert stack.ready()  # the first one is untouched


def test_a_killed_api_is_restarted(stack: UpStack) -> None:
    old = stack.kill("api")
    stack.wait_restarted("api", old)
    stack.wait_ready()
    assert "api was killed by signal SIGKILL" in stack.log()


def test_a_killed_valkey_is_restarted_on_its_aof_without_losing_a_write(stack: UpStack) -> None:
    post(stack, range(100, 120))  # acknowledged: on disk
    old = stack.kill("valkey")
    stack.wait_restarted("valkey", old)
    wait_until(lambda: stack.http.get("/readyz").status_code == 200, 60, "readyz after the restart")
    post(stack, range(120, 125))
    assert set(range(100, 125)) <= stored_ids(stack)
    assert "valkey was killed by signal SIGKILL" in stack.log()


def test_a_killed_workers_job_is_queued_again_at_once_and_finishes(stack: UpStack) -> None:
    post(stack, range(0, 16))
    job = stack.http.post("/v1/tasks/reviews/train", json=LONG_JOB).json()

    def record() -> dict:
        return stack.http.get(f"/v1/jobs/{job['id']}").json()

    wait_until(lambda: record()["progress"] > 0, 60, "the job running", poll=0.02)
    old = stack.kill("worker")
    killed = time.monotonic()
    requeued = wait_until(lambda: (r := record())["state"] == "queued" and r, 5, "the job queued again", 0.02)
    assert time.monotonic() - killed < 3 and "SIGKILL" in requeued["error"]
    readyz = wait_until(lambda: (r := stack.http.get("/readyz").json()).get("workers") == [] and r, 5, "")
    assert "no trainer worker" in readyz["warning"]  # readyz says what is down

    stack.wait_restarted("worker", old)
    final = wait_until(lambda: (r := record())["state"] in ("succeeded", "failed") and r, 120, "the job")
    assert final["state"] == "succeeded", final
    assert stack.wait_ready()["workers"] == ["worker-1"]


def test_up_gives_up_on_a_crash_loop_with_a_reason(tmp_path: Path, causal_dir: Path) -> None:
    with socket.socket() as taken:  # the api's port is taken: it can never start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        up = UpStack(tmp_path, causal_dir, restart_limit="2", restart_backoff_s="0.1")
        up.env["OPENBOOK_PORT"] = str(taken.getsockname()[1])
        up.start()
        assert up.process is not None
        try:
            code = up.process.wait(timeout=120)
        finally:
            up.stop()
    log = up.log()
    assert code != 0
    assert "api exited with code" in log and "giving up: api died 2 times in" in log, log[-3000:]
    assert not up.pids()


def test_valkey_exiting_on_a_failed_aof_write_is_restarted_and_says_why(tmp_path: Path) -> None:
    def small_disk() -> None:  # a file size limit fails the AOF's writes as a full disk would
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))

    server = EmbeddedRedis(tmp_path / "redis", preexec_fn=small_disk)
    log: list[str] = []

    def starts() -> int:
        return sum(line.startswith("valkey started") for line in log)

    stopping = threading.Event()
    supervisor = Supervisor([valkey_child(server)], RestartPolicy(limit=3), log=log.append, poll_s=0.02)
    thread = threading.Thread(target=supervisor.run, args=(stopping,))
    thread.start()
    try:
        wait_until(lambda: starts() == 1, 30, "valkey started and answering")
        no_retry = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
        acknowledged = []
        with pytest.raises(redis.ConnectionError):
            for i in range(10_000):
                ExampleLog(no_retry, "t").append([NewExample(f"text {i}", "0", id=i)])
                acknowledged.append(i)
        wait_until(lambda: starts() == 2, 30, "valkey restarted")
        entries = ExampleLog(redis.Redis.from_url(server.url), "t").read()
    finally:
        stopping.set()
        thread.join(timeout=30)
    assert len(acknowledged) >= 50  # the disk filled up, not a server still starting
    assert {e.id for e in entries} >= set(acknowledged)  # every acknowledged write
    died = next(line for line in log if line.startswith("valkey exited"))
    assert "exited with code 1" in died and "Can't recover from AOF write error" in died, log


def test_the_demo_task_trains_by_itself(server, causal_dir: Path) -> None:
    from services.api.app import create_app
    from services.cli.up import DEMO_TRAINING, _seed_demo
    from services.client import OpenBookClient
    from tests.services.harness import api_settings, serving

    with serving(create_app(api_settings(server.url, causal_dir))) as base:
        _seed_demo(base, threading.Event())
        with OpenBookClient(base) as client:
            (job,) = client.jobs("sentiment")  # its 8 examples are one `every`: one job, queued at once
            assert job.trigger == "auto" and job.train_config["steps"] == DEMO_TRAINING["steps"]
            assert client.update_training("sentiment", every=20).training.every == 20
            _seed_demo(base, threading.Event())  # again, on a task whose settings changed: left as it is
            assert len(client.jobs("sentiment")) == 1


# Loaded by every Python process of a stack whose PYTHONPATH starts with its folder: in the api alone, it
# makes each forward take SLOW_FORWARD_S seconds, and says when one has started by creating SLOW_FORWARD_MARK.
SLOW_FORWARD = """
import os, pathlib, sys, time

if "serve" in sys.argv and os.environ.get("SLOW_FORWARD_S"):
    from services.engine import runtime

    predict = runtime.TaskRuntime.predict

    def slow_predict(self, texts):
        pathlib.Path(os.environ["SLOW_FORWARD_MARK"]).touch()
        time.sleep(float(os.environ["SLOW_FORWARD_S"]))
        return predict(self, texts)

    runtime.TaskRuntime.predict = slow_predict
"""


def processes_in_groups(groups: set[int]) -> dict[int, str]:
    """Live processes (pid -> state) whose process group is one of `groups`, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[2]) in groups and fields[0] != "Z":
                found[int(entry.name)] = fields[0]
    return found


def test_a_stop_in_the_middle_of_a_long_forward_leaves_no_process_and_frees_the_port(
    tmp_path: Path, causal_dir: Path
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_FORWARD)
    marker = tmp_path / "forward-started"
    up = UpStack(tmp_path / "stack", causal_dir)
    up.env |= {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), up.env.get("PYTHONPATH")])),
        "SLOW_FORWARD_S": "120",
        "SLOW_FORWARD_MARK": str(marker),
    }
    up.start()
    groups: set[int] = set()
    try:
        up.wait_ready()
        assert up.http.post("/v1/tasks", json=TASK).status_code == 201
        groups = set(up.pids().values())  # each child leads a process group of its own
        assert len(groups) == 3

        def classify() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the api is stopped under it
                httpx.post(f"{up.base}/v1/tasks/reviews/classify", json={"texts": ["fun"]}, timeout=150)

        threading.Thread(target=classify, daemon=True).start()
        wait_until(marker.exists, 60, "the slow forward started")

        assert up.process is not None
        up.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.process.wait(timeout=10)
        left = processes_in_groups(groups)
        took = time.monotonic() - stopped
        assert up.process.returncode == 0 and not left and took < 10, (took, left, up.log()[-3000:])
        assert "api did not stop within 5 s of SIGTERM: killing it" in up.log()  # its forward held it
        with socket.socket() as probe:  # nothing listens on the api's port: a new api could (as uvicorn
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # does, past the killed connection)
            probe.bind(("127.0.0.1", up.port))
            probe.listen()
    finally:
        for group in groups:  # whatever a failed assertion left behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        up.stop()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OPENBOOK_DEVICE", "gpu0", "OPENBOOK_DEVICE: unknown device 'gpu0'"),
        ("OPENBOOK_PORT", "eighty", "OPENBOOK_PORT: Input should be a valid integer"),
        ("OPENBOOK_API_WORKERS", "0", "OPENBOOK_API_WORKERS: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_setting_stops_each_service_command_in_one_line_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path, variable: str, value: str, said: str
) -> None:
    from services.cli import main

    monkeypatch.setenv("OPENBOOK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(variable, value)
    for command in ("up", "serve", "worker"):
        assert main([command]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"openbook {command}: error: {said}") and error.count("\n") == 1
    assert not (tmp_path / "data").exists()  # nothing started, nothing written


def test_a_device_torch_cannot_reach_here_stops_the_service_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import torch

    from services.cli import settings_problem

    monkeypatch.setenv("OPENBOOK_DEVICE", "cuda")
    if torch.cuda.is_available():
        assert settings_problem() is None
    else:
        assert (
            settings_problem()
            == "OPENBOOK_DEVICE: device 'cuda': torch sees no CUDA GPU on this machine; name cpu"
        )
