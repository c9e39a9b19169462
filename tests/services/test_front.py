"""The front (services/api/front.py): single-text classify requests gathered into one to the replica."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from services.api.app import create_app
from services.api.front import Front, front_app
from services.bus.server import EmbeddedRedis
from tests.services.harness import api_settings, serving

TASK = {
    "name": "reviews",
    "template": "Review: {text}\nSentiment: {mask}",
    "labels": {"0": "bad", "1": "good"},
}
TEXTS = ["a good film", "it was terrible and boring", "great fun", "a bad film, awful", "fun", "dull"] * 4


@pytest.fixture()
def replica(server: EmbeddedRedis, causal_dir: Path):
    app = create_app(api_settings(server.url, causal_dir, api_key="write", read_key="read"))
    with serving(app) as base:
        with httpx.Client(base_url=base, headers={"X-API-Key": "write"}, timeout=60) as api:
            api.post("/v1/tasks", json=TASK).raise_for_status()
            examples = [{"text": t, "label": str(i % 2)} for i, t in enumerate(TEXTS[:8])]
            api.post("/v1/tasks/reviews/examples", json={"examples": examples}).raise_for_status()
        yield base


async def _many(base: str, bodies: list[dict], key: str = "read") -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": key}, timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/tasks/reviews/classify", json=b) for b in bodies))


def test_gathered_requests_get_the_answers_they_would_have_had_alone(replica: str) -> None:
    front = Front(replica, max_wait=0.05)
    with serving(front) as base:
        direct = asyncio.run(_many(replica, [{"texts": [t]} for t in TEXTS]))
        gathered = asyncio.run(_many(base, [{"texts": [t]} for t in TEXTS]))
    assert front.gatherer.gathered >= 1 and front.gatherer.sent < len(TEXTS)  # in fewer requests
    for alone, together in zip(direct, gathered, strict=True):
        assert together.status_code == alone.status_code == 200
        ours, theirs = together.json(), alone.json()
        assert len(ours["predictions"]) == 1 and ours["model_version"] == theirs["model_version"]
        assert ours["predictions"][0]["label"] == theirs["predictions"][0]["label"]
        for label, p in theirs["predictions"][0]["probabilities"].items():
            assert ours["predictions"][0]["probabilities"][label] == pytest.approx(p, abs=1e-4)


def test_a_refused_request_does_not_fail_the_others_it_was_gathered_with(replica: str) -> None:
    front = Front(replica, max_wait=0.05)
    bodies = [{"texts": ["a good film"]}, {"texts": [""]}, {"texts": ["fun"]}, {"texts": "not a list"}]
    with serving(front) as base:
        gathered = asyncio.run(_many(base, bodies))
        direct = asyncio.run(_many(replica, bodies))
    assert [r.status_code for r in gathered] == [r.status_code for r in direct]
    assert gathered[0].status_code == 200 and gathered[1].status_code == 422
    assert gathered[1].json() == direct[1].json() and gathered[3].json() == direct[3].json()


def test_requests_are_gathered_only_with_the_same_key_and_options(replica: str) -> None:
    front = Front(replica, max_wait=0.05)

    async def mixed(base: str) -> list[httpx.Response]:
        return [
            *await asyncio.gather(
                _many(base, [{"texts": ["fun"]}, {"texts": ["dull"], "neighbours": True}], key="read"),
                _many(base, [{"texts": ["a good film"]}], key="wrong"),
            )
        ]

    with serving(front) as base:
        (read, wrong) = asyncio.run(mixed(base))
    assert [r.status_code for r in read] == [200, 200]
    assert wrong[0].status_code == 403  # a wrong key, refused, not answered with the right key's results
    assert read[0].json()["predictions"][0].get("neighbours") is None
    assert read[1].json()["predictions"][0]["neighbours"]  # its own option, not its neighbour's
    assert front.gatherer.gathered == 0 and front.gatherer.sent == 3  # three groups of one


def test_the_front_passes_everything_else_through_and_limits_bodies(replica: str) -> None:
    app = front_app(replica, max_body_bytes=2_000, max_texts=64)
    key = {"X-API-Key": "write"}
    with serving(app) as base, httpx.Client(base_url=base, headers=key, timeout=60) as front:
        direct = httpx.get(f"{replica}/v1/tasks/reviews", headers=key).json()
        assert front.get("/v1/tasks/reviews").json() == direct
        assert front.get("/v1/tasks/nothing").status_code == 404
        too_big = front.post("/v1/tasks/reviews/classify", json={"texts": ["x" * 3_000]})
        assert too_big.status_code == 413 and "limit" in too_big.json()["detail"]


def test_an_unreachable_replica_is_a_502(tmp_path: Path) -> None:
    from services.bus.server import free_port

    with serving(Front(f"http://127.0.0.1:{free_port()}", max_wait=0.01)) as base:
        answers = asyncio.run(_many(base, [{"texts": ["fun"]}, {"texts": ["dull"]}]))
    assert [r.status_code for r in answers] == [502, 502]
    assert "unreachable" in answers[0].json()["detail"]


def test_a_lone_request_goes_at_once_not_after_the_longest_wait(replica: str) -> None:
    front = Front(replica, max_wait=30.0)  # a request held for it would outlast the client's timeout
    with serving(front) as base:
        answer = httpx.post(
            f"{base}/v1/tasks/reviews/classify",
            json={"texts": ["fun"]},
            headers={"X-API-Key": "read"},
            timeout=10,
        )
    assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1


@pytest.mark.parametrize("command", ["up", "serve"])
def test_the_front_workers_flag_sets_the_setting(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.api.settings import Settings
    from services.cli import main

    monkeypatch.setenv("OPENBOOK_FRONT_WORKERS", "0")  # and restored after
    monkeypatch.setattr(f"services.cli.{command}.run", lambda args: Settings().front_workers)
    assert main([command, "--front-workers", "2"]) == 2


def test_serve_with_fronts_ends_when_its_replica_dies(server: EmbeddedRedis, causal_dir: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from services.bus.server import free_port
    from services.client import wait_ready

    port = free_port()
    environment = {
        "OPENBOOK_REDIS_URL": server.url,
        "OPENBOOK_DEFAULT_BACKBONE": str(causal_dir),
        "OPENBOOK_PORT": str(port),
        "OPENBOOK_FRONT_WORKERS": "1",
        "OPENBOOK_THREADS": "1",
    }
    serve = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve"],
        env={**os.environ, **environment},
        start_new_session=True,
    )
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", timeout=120, alive=lambda: serve.poll() is None)
        found = subprocess.run(
            ["pgrep", "-P", str(serve.pid), "-f", "services.cli serve"], capture_output=True
        )
        (replica,) = [int(pid) for pid in found.stdout.split()]
        os.kill(replica, signal.SIGKILL)
        assert serve.wait(60) == 1  # the fronts stopped, and serve says the replica failed
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)


def _closed_loop(clients: int, trip: float, spread: float, max_wait: float, seconds: float) -> list[int]:
    """`clients` each sending one text at a time through a Gatherer, each again `spread` seconds or less
    after its answer, to a replica that answers one request at a time in `trip` seconds: the texts of
    each request the replica got."""
    import json

    from services.api.front import Gatherer

    async def run() -> list[int]:
        sizes: list[int] = []
        replica = asyncio.Lock()

        async def upstream(method, path, headers, body):
            texts = json.loads(body)["texts"]
            async with replica:
                sizes.append(len(texts))
                await asyncio.sleep(trip)
            return 200, [], json.dumps({"predictions": [{"label": "a"}] * len(texts)}).encode()

        gatherer = Gatherer(upstream, max_texts=64, max_bytes=256_000, max_wait=max_wait)
        stop = asyncio.get_running_loop().time() + seconds

        async def client(i: int) -> None:
            while asyncio.get_running_loop().time() < stop:
                body = json.dumps({"texts": [f"text {i}"]}).encode()
                status, _, _ = await gatherer.classify("/v1/tasks/t/classify", [], body)
                assert status == 200
                await asyncio.sleep(spread * i / clients)

        await asyncio.gather(*(client(i) for i in range(clients)))
        return sizes

    return asyncio.run(run())


def test_a_wave_of_requests_goes_whole_not_one_text_then_the_rest() -> None:
    """Closed-loop clients resend a few milliseconds apart. Sending a wave's first request at once and
    the rest after it returned made the trips alternate between 1 text and 31 (two replica round trips
    a wave, each paying the replica's per-request cost): the wave waits for itself instead. `max_wait` is
    far above the spread so that a stalled event loop (a loaded machine) cannot split a wave by timer."""
    sizes = _closed_loop(clients=32, trip=0.02, spread=0.004, max_wait=1.0, seconds=1.0)
    # the last wave may be cut: the clients whose resend falls past the run's end send nothing, and the
    # rest go after `max_wait` (in about one run in eight)
    steady = sizes[3:-1]
    assert len(steady) >= 10 and min(steady) >= 30, sizes


def test_a_lone_client_never_waits_for_a_wave() -> None:
    sizes = _closed_loop(clients=1, trip=0.01, spread=0.0, max_wait=5.0, seconds=0.5)
    assert len(sizes) >= 20 and set(sizes) == {1}  # each request at once, none held for max_wait
