"""Schemathesis against the live api (uvicorn, a real Redis, the tiny backbone): the OpenAPI is the contract.

The `st` command fuzzes every operation from the served OpenAPI with a fixed seed and a bounded number of
examples per operation, and runs every check: no 5xx, declared status codes, content types and headers,
responses that conform to their schema, schema-valid requests accepted and schema-invalid ones rejected,
the right 405 and Allow, 401 without a key. The server's own metrics count what it answered, 500s
included. `make fuzz` runs a longer profile (OPENBOOK_FUZZ_EXAMPLES) and prints the figures.
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

EXAMPLES = int(os.environ.get("OPENBOOK_FUZZ_EXAMPLES", "5"))  # per operation, in the fuzzing phase
SEED = int(os.environ.get("OPENBOOK_FUZZ_SEED", "20240601"))
ROOT = Path(__file__).resolve().parents[2]
KEY = "fuzz-write"  # the run writes and reads with it; a request without it must get its 401
AUTH = {"X-API-Key": KEY}
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
        settings = api_settings(
            redis_server.url, causal_dir, max_batch=8, max_text_chars=400, api_key=KEY, read_key="fuzz-read"
        )
        with serving(create_app(settings)) as base:
            for task in (TASK, PAIR_TASK):
                assert httpx.post(f"{base}/v1/tasks", json=task, headers=AUTH).status_code == 201
                body = {"examples": SEEDED[task["name"]]}
                added = httpx.post(f"{base}/v1/tasks/{task['name']}/examples", json=body, headers=AUTH)
                assert added.status_code == 201
            before = _answered(base)
            started = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json",
                 "--checks", "all", "--seed", str(SEED), "--max-examples", str(EXAMPLES),
                 "--generation-database", "none", "--workers", "1", "--no-color", "-H", f"X-API-Key: {KEY}",
                 "--report", "json", "--report-json-path", str(tmp_path / "report.json")],
                env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.services.fuzz_hooks",
                     "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)])},
                cwd=tmp_path, capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            after = _answered(base)
    server_errors = after.get("5xx", 0) - before.get("5xx", 0)
    report = json.loads((tmp_path / "report.json").read_text())
    at = run.stdout.find("SUMMARY")
    summary = run.stdout[run.stdout.rfind("\n", 0, at) + 1 :] if at >= 0 else run.stdout
    print(f"\n{summary}")
    print(
        f"fuzz: {report['test_cases']['generated']} requests generated "
        f"({sum(after.values()) - sum(before.values())} answered), {server_errors} answered 5xx, "
        f"{report['test_cases']['unique_failures']} contract failures, {len(report['errors'])} errors, "
        f"{seconds:.0f} s (seed {SEED}, {EXAMPLES} examples per operation)"
    )
    assert server_errors == 0
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
