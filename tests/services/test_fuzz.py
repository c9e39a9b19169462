"""Schemathesis against the live api (uvicorn, a real Redis, the tiny backbone): the OpenAPI is the contract.

The `st` command fuzzes every operation from the served OpenAPI with a fixed seed and a bounded number of
examples per operation, and runs every check: no 5xx, declared status codes, content types and headers,
responses that conform to their schema, schema-valid requests accepted and schema-invalid ones rejected,
the right 405 and Allow. The server's own metrics count what it answered. `make fuzz` runs a longer
profile (OPENBOOK_FUZZ_EXAMPLES) and prints the figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from services.api.app import create_app
from services.bus.server import EmbeddedRedis
from tests.services.harness import PAIR_TASK, TASK, api_settings, serving

EXAMPLES = int(os.environ.get("OPENBOOK_FUZZ_EXAMPLES", "10"))  # per operation and phase
SEED = int(os.environ.get("OPENBOOK_FUZZ_SEED", "20240601"))
ROOT = Path(__file__).resolve().parents[2]
SEEDED = {
    TASK["name"]: [{"text": "a good film", "label": "1"}, {"text": "boring", "label": "0"}],
    PAIR_TASK["name"]: [{"text": ["it rains", "it is wet"], "label": "yes"}],
}


def _answered(base: str) -> dict[str, int]:
    """Requests the server answered, by status class, from its own latency histogram."""
    counts: dict[str, int] = {}
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        found = re.match(r'openbook_request_seconds_count\{.*status="(\d)\d\d"\} ([0-9.e+]+)', line)
        if found:
            counts[f"{found[1]}xx"] = counts.get(f"{found[1]}xx", 0) + int(float(found[2]))
    return counts


def test_the_live_api_keeps_its_openapi_contract(tmp_path: Path, causal_dir: Path) -> None:
    with EmbeddedRedis(tmp_path / "redis") as redis_server:
        settings = api_settings(redis_server.url, causal_dir, max_batch=8, max_text_chars=400)
        with serving(create_app(settings)) as base:
            for task in (TASK, PAIR_TASK):
                assert httpx.post(f"{base}/v1/tasks", json=task).status_code == 201
                body = {"examples": SEEDED[task["name"]]}
                assert httpx.post(f"{base}/v1/tasks/{task['name']}/examples", json=body).status_code == 201
            before = _answered(base)
            started = time.perf_counter()
            report = tmp_path / "report.json"
            run = subprocess.run(
                [sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json",
                 "--checks", "all", "--seed", str(SEED), "--max-examples", str(EXAMPLES),
                 "--generation-database", "none", "--workers", "1", "--no-color",
                 "--report", "json", "--report-json-path", str(report)],
                env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.services.fuzz_hooks",
                     "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)])},
                cwd=tmp_path, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            after = _answered(base)
    answered = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    summary = json.loads(report.read_text()) if report.exists() else {}
    print(run.stdout, run.stderr, sep="\n")
    print(
        f"fuzz: {sum(answered.values())} requests answered {answered}, "
        f"{answered.get('5xx', 0)} answered 5xx, exit {run.returncode}, {seconds:.0f} s"
    )
    print(json.dumps(summary)[:3000])
    assert answered.get("5xx", 0) == 0
    assert run.returncode == 0, run.stdout[-6000:]
