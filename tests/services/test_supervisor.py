"""The supervisor on small stand-in children: restarts with backoff, causes of death, giving up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.cli.supervisor import Child, RestartPolicy, Supervisor, cause_of_death


def python(code: str):
    return lambda: subprocess.Popen([sys.executable, "-c", code])


def supervise(children: list[Child], policy: RestartPolicy) -> tuple[threading.Thread, threading.Event, list]:
    log: list[str] = []
    stopping = threading.Event()
    result: list[int] = []
    supervisor = Supervisor(children, policy, log=log.append, poll_s=0.02)
    thread = threading.Thread(target=lambda: result.append(supervisor.run(stopping)))
    thread.start()
    return thread, stopping, [log, result]


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_killed_child_is_restarted_and_its_death_handed_on() -> None:
    deaths: list[str] = []
    sleeper = Child("sleeper", start=python("import time; time.sleep(60)"), on_death=deaths.append)
    thread, stopping, (log, result) = supervise([sleeper], RestartPolicy(limit=3, backoff_s=0.05))
    wait_for(lambda: sleeper.process is not None)
    first = sleeper.process
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: sleeper.process is not None and sleeper.process is not first)
    second = sleeper.process
    stopping.set()
    thread.join(timeout=30)
    assert result == [0] and deaths == ["was killed by signal SIGKILL"]
    assert "sleeper was killed by signal SIGKILL" in log and "restarting sleeper in 0.05 s" in log[2]
    assert second.poll() is not None  # stopped with the supervisor


def test_a_crash_loop_ends_the_supervision_with_a_reason() -> None:
    crasher = Child("crasher", start=python("import sys; sys.exit(3)"))
    bystander = Child("bystander", start=python("import time; time.sleep(60)"))
    thread, _, (log, result) = supervise([bystander, crasher], RestartPolicy(limit=3, backoff_s=0.05))
    thread.join(timeout=30)
    assert result == [1]
    assert log.count("crasher exited with code 3") == 3
    delays = [line.split(" in ")[1].split(" s")[0] for line in log if line.startswith("restarting crasher")]
    assert delays == ["0.05", "0.1"]  # doubling
    assert log[-1].startswith("giving up: crasher died 3 times in")
    assert bystander.process is None  # stopped too


def test_a_start_that_fails_counts_as_a_death() -> None:
    def no_server():
        raise RuntimeError("embedded redis did not start: No space left on device")

    server = Child("valkey", start=no_server)
    thread, _, (log, result) = supervise([server], RestartPolicy(limit=2, backoff_s=0.01))
    thread.join(timeout=30)
    assert result == [1] and "valkey failed to start: embedded redis did not start: No space" in log[0]


def test_old_deaths_leave_the_window() -> None:
    policy = RestartPolicy(limit=2, window_s=0.2, backoff_s=0.01)
    flaky = Child("flaky", start=python("import time; time.sleep(0.4)"))  # 2 deaths never within 0.2 s
    thread, stopping, (log, result) = supervise([flaky], policy)
    time.sleep(1.5)
    stopping.set()
    thread.join(timeout=30)
    assert result == [0] and log.count("flaky exited with code 0") >= 2


@pytest.mark.parametrize(("code", "cause"), [(1, "exited with code 1"), (-9, "was killed by signal SIGKILL")])
def test_causes_of_death(code: int, cause: str) -> None:
    assert cause_of_death(code) == cause


# A child in a session of its own that starts a grandchild, and neither heeds SIGTERM: as uvicorn's api
# workers in the middle of a forward. Prints the grandchild's pid.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
print(subprocess.Popen([sys.executable, "-c", code]).pid, flush=True)
time.sleep(60)
"""


def stubborn() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, start_new_session=True)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_stop_kills_the_childs_whole_group_after_its_grace() -> None:
    child = Child("stubborn", start=stubborn, stop_timeout_s=0.5)
    thread, stopping, (log, result) = supervise([child], RestartPolicy())
    wait_for(lambda: child.process is not None)
    process = child.process
    assert process is not None and process.stdout is not None
    grandchild = int(process.stdout.readline())
    stopping.set()
    started = time.monotonic()
    thread.join(timeout=30)
    assert result == [0] and time.monotonic() - started < 5
    assert "stubborn did not stop within 0.5 s of SIGTERM: killing it" in log
    wait_for(lambda: not alive(process.pid) and not alive(grandchild), timeout=5)


def test_what_a_dead_child_left_behind_is_killed_before_its_restart() -> None:
    child = Child("stubborn", start=stubborn, stop_timeout_s=0.5)
    thread, stopping, (log, result) = supervise([child], RestartPolicy(backoff_s=0.05))
    wait_for(lambda: child.process is not None)
    first = child.process
    assert first is not None and first.stdout is not None
    orphan = int(first.stdout.readline())
    os.kill(first.pid, signal.SIGKILL)  # the child dies; its own child would hold on (to a port, say)
    wait_for(lambda: child.process is not None and child.process is not first)
    wait_for(lambda: not alive(orphan), timeout=5)
    stopping.set()
    thread.join(timeout=30)
    assert result == [0] and "stubborn was killed by signal SIGKILL" in log
