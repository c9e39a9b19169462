"""The console in a real browser (Debian's Chromium driven by Playwright) against `openbook up`.

The stack runs as `python -m services.cli up` on the tiny random causal model, with a write key,
so the console has to ask for it. Screenshots of each panel go to test-artifacts/console/ (or
$OPENBOOK_TEST_ARTIFACTS/console), printed by the walkthrough.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from services.api.console import mount_console
from services.bus.server import free_port
from services.client import wait_ready

ROOT = Path(__file__).resolve().parents[2]
KEY = "console-test-key"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium phones home, and a closed network refuses its connections.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000
TRAINING_WAIT_MS = 120_000


def _chromium() -> str:
    found = (
        os.environ.get("OPENBOOK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not found:
        pytest.skip(
            "Chromium is not installed, so the console's browser tests cannot run: "
            "`apt-get install chromium` (make test tries it when run as root), or set OPENBOOK_CHROMIUM"
        )
    return found


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (requirements-dev.txt)")
    expect.set_options(timeout=WAIT_MS)  # a task's creation loads its backbone: seconds on 2 busy cores
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@dataclass
class Stack:
    base: str
    http: httpx.Client  # with the key: what the test checks through the api, not the page

    def examples(self, task: str) -> list[dict]:
        return self.http.get(f"/v1/tasks/{task}/examples", params={"limit": 1000}).json()["examples"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, causal_dir: Path) -> Iterator[Stack]:
    _chromium()  # no stack to start when there is no browser to drive it
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBOOK_REDIS_URL", "REDIS_URL")}
    env |= {
        "OPENBOOK_DATA_DIR": str(tmp_path_factory.mktemp("console-data")),
        "OPENBOOK_PORT": str(port),
        "OPENBOOK_DEFAULT_BACKBONE": str(causal_dir),
        "OPENBOOK_MAX_LENGTH": "48",
        "OPENBOOK_API_KEY": KEY,
        "OPENBOOK_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT), env.get("PYTHONPATH", "")]),
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up"], env=env, cwd=ROOT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(base, timeout=90, alive=lambda: up.poll() is None), "openbook up did not get ready"
        with httpx.Client(base_url=base, headers={"X-API-Key": KEY}, timeout=30) as http:
            yield Stack(base, http)
    finally:
        up.send_signal(signal.SIGTERM)  # `up` stops the api, the worker and Redis
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)


@dataclass
class Console:
    page: object
    base: str
    shots: Path
    requests: list[str] = field(default_factory=list)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()

    def foreign_requests(self) -> list[str]:
        origin = urlsplit(self.base)[:2]
        return [url for url in self.requests if urlsplit(url)[:2] != origin]


@contextlib.contextmanager
def _console(browser, base: str) -> Iterator[Console]:
    shots = Path(os.environ.get("OPENBOOK_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
    shots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800})  # a fresh sessionStorage
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    opened = Console(page, base, shots)
    context.on("request", lambda request: opened.requests.append(request.url))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture()
def console(browser, stack: Stack) -> Iterator[Console]:
    with _console(browser, stack.base) as opened:
        yield opened


@pytest.fixture()
def static_console(browser) -> Iterator[Console]:
    """The console's files alone, on an app with no task, Redis or model: for the page's own code."""
    app = FastAPI()
    mount_console(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the static server did not start"
        time.sleep(0.05)
    try:
        with _console(browser, f"http://127.0.0.1:{server.config.port}") as opened:
            yield opened
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def open_console(console: Console) -> None:
    console.page.goto(f"{console.base}/")
    console.page.wait_for_selector("body[data-ready=true]")


def csv_file(name: str, rows: list[tuple]) -> dict:
    lines = ["text,label,id"] + [
        ",".join(f'"{c}"' if isinstance(c, str) else str(c) for c in row) for row in rows
    ]
    return {"name": name, "mimeType": "text/csv", "buffer": "\n".join(lines).encode()}


def test_walkthrough_from_a_new_task_to_a_trained_version(console: Console, stack: Stack, capsys) -> None:
    from playwright.sync_api import expect

    page = console.page
    with capsys.disabled():
        print(f"\nconsole screenshots: {console.shots}")
    open_console(console)
    # The api takes reads too only with the key (OPENBOOK_API_KEY alone guards both): the console asks
    # for it once, and keeps it for the tab.
    expect(page.locator("#key-dialog")).to_be_visible()
    expect(page.locator("#auth-message")).to_contain_text("only with a key")
    page.get_by_label("Key", exact=True).fill(KEY)
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#key-dialog")).to_be_hidden()
    # No task yet: the console opens on the form that creates one. The api offers automatic training
    # and suggestions, so their controls show (versions and labels: below, in their tabs).
    expect(page.get_by_role("tab", name="Tasks")).to_have_attribute("aria-selected", "true")
    for shown in ("#auto-train", "#tab-suggestions"):
        expect(page.locator(shown)).to_be_visible()

    page.get_by_label("Name").fill("reviews")
    page.get_by_label("Template").fill("{text} It was {mask}")
    for i, (label, word) in enumerate([("0", "bad"), ("1", "good")], start=1):
        page.locator(f"#label-{i}").fill(label)
        page.locator(f"#word-{i}").fill(word)
    page.get_by_label("Preview with a sample text").fill("a fine film")
    expect(page.locator("#template-preview")).to_have_text("a fine film It was [bad | good]")
    page.get_by_label("Train automatically every N new examples").fill("100")  # not reached here
    console.shot("tasks")

    page.get_by_role("button", name="Create task").click()
    expect(page.get_by_role("tab", name="Try it")).to_have_attribute("aria-selected", "true")
    spec = stack.http.get("/v1/tasks/reviews").json()
    assert spec["labels"] == {"0": "bad", "1": "good"}
    assert (spec["training"]["auto"], spec["training"]["every"]) == (True, 100)

    console.tab("Teach")
    expect(page.locator("#label-form")).to_be_visible()  # the api can add labels
    for text, label in [("a good film with a great cast", "1"), ("it was terrible and boring", "0")]:
        page.locator("#add-text").fill(text)
        page.locator("#add-label").select_option(label)
        page.get_by_role("button", name="Add", exact=True).click()
        expect(page.locator("#add-status")).to_contain_text("Added example")
    assert {(e["text"], e["label"]) for e in stack.examples("reviews")} == {
        ("a good film with a great cast", "1"),
        ("it was terrible and boring", "0"),
    }

    # A file with bad rows writes nothing, and says which rows and why.
    bad = csv_file(
        "bad.csv", [("the movie was great", "1", 10), ("", "0", 11), ("so-so", "2", 12), ("dull", "0", 10)]
    )
    page.locator("#upload-file").set_input_files(bad)
    expect(page.locator("#upload-summary")).to_contain_text("3 of 4 rows have errors")
    preview = page.locator("#upload-preview")
    for error in ("empty text", 'unknown label "2"', "duplicate id 10 (also on line 2)"):
        expect(preview).to_contain_text(error)
    expect(page.get_by_role("button", name="Upload")).to_be_disabled()
    console.shot("teach-errors")
    assert len(stack.examples("reviews")) == 2
    page.locator("#upload-file").set_input_files(
        {
            "name": "bad.jsonl",
            "mimeType": "application/json",
            "buffer": b'{"text": "fine", "label": "1"}\n{oops\n',
        }
    )
    expect(preview).to_contain_text("not a JSON line")
    expect(page.get_by_role("button", name="Upload")).to_be_disabled()

    # 70 good rows go in two batches (the api takes 64 examples per POST).
    words = ["great", "fun", "good", "terrible", "boring", "awful", "okay"]
    rows = [(f"the film {i} was {words[i % 7]}", "1" if i % 7 < 3 else "0", 1000 + i) for i in range(70)]
    page.locator("#upload-file").set_input_files(csv_file("good.csv", rows))
    expect(page.locator("#upload-summary")).to_contain_text("70 rows, all good")
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#upload-status")).to_contain_text("Uploaded 70 rows: 70 new")
    assert len(stack.examples("reviews")) == 72
    expect(page.locator("#example-total")).to_have_text("(72)")
    # 30 of label 1 from the file, 1 from the form
    expect(page.locator('#label-counts [data-label="1"]')).to_contain_text("31")

    # Search, then delete an example (confirmed in a dialog).
    page.get_by_label("Search").fill("film 5 was")
    expect(page.locator("#examples-table tbody tr")).to_have_count(1)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete example 1005").click()
    expect(page.locator("#examples-table")).to_contain_text("Nothing matches")
    assert 1005 not in {e["id"] for e in stack.examples("reviews")}
    expect(page.locator("#example-total")).to_have_text("(71)")
    page.get_by_label("Search").fill("")
    console.shot("teach")

    console.tab("Try it")
    page.get_by_label("Texts to classify, one per line").fill("a good film\nit was boring")
    page.get_by_role("button", name="Classify").click()
    cards = page.locator("article.prediction")
    expect(cards).to_have_count(2)
    first = cards.first
    expect(first.locator(".neighbours tbody tr").first).to_be_visible()
    expect(first.locator(".demonstrations .demo-class")).to_have_count(2)
    expect(page.locator("#model-version")).to_have_text("base")
    console.shot("try")

    # "Correct it": one click makes the text a labelled example; the same click again adds nothing.
    first.get_by_role("button", name="Add this text as an example of 0 (bad)").click()
    expect(first.locator(".correct .status")).to_contain_text("Added as example")
    first.get_by_role("button", name="Add this text as an example of 0 (bad)").click()
    expect(first.locator(".correct .status")).to_contain_text("Already in the book")
    assert [e["label"] for e in stack.examples("reviews") if e["text"] == "a good film"] == ["0"]

    # Suggestions from the real api: the pool's texts, least certain first; a key press labels the
    # focused one, and the api takes it out of the pool.
    pool = {"texts": [{"id": 9001, "text": "an okay film"}, {"id": 9002, "text": "fun but boring"}]}
    assert stack.http.post("/v1/tasks/reviews/pool", json=pool).status_code == 201
    console.tab("Suggestions")
    expect(page.locator("#suggestions li")).to_have_count(2)
    focused = page.locator("#suggestions li").first
    expect(focused).to_be_focused()
    labelled = int(focused.get_attribute("data-id"))
    page.keyboard.press("2")  # "2" is the second label, 1
    expect(page.locator("#suggestions-status")).to_contain_text(f"Labelled #{labelled} as 1")
    assert [e["label"] for e in stack.examples("reviews") if e["id"] == labelled] == ["1"]
    assert [t["id"] for t in stack.http.get("/v1/tasks/reviews/pool").json()["texts"]] == [
        i for i in (9001, 9002) if i != labelled
    ]
    console.shot("suggestions")

    console.tab("Training")
    page.locator("#train-method").fill("prompt-ft")
    page.locator("#train-steps").fill("2")
    page.get_by_role("button", name="Start training").click()
    job = page.locator("#jobs tbody tr").first
    expect(job).to_have_attribute("data-state", "succeeded", timeout=TRAINING_WAIT_MS)
    version = job.locator(".job-version").inner_text()
    expect(page.locator("#serving-version")).to_have_text(version, timeout=TRAINING_WAIT_MS)
    expect(page.locator(f'#versions tr[data-version="{version}"]')).to_contain_text("serving")
    console.shot("training")

    console.tab("Try it")
    page.get_by_role("button", name="Classify").click()
    expect(page.locator("#model-version")).to_have_text(version)
    assert version != "base"

    console.tab("Health")
    expect(page.locator("#health-ready")).to_contain_text("ready · 1 task · trainer: worker-1")
    expect(page.locator('#health-tasks tr[data-task="reviews"]')).to_contain_text(version)
    expect(page.locator("#health-latency")).to_contain_text("POST /v1/tasks/{task}/classify")
    console.shot("health")
    page.get_by_role("tab", name="Health").focus()  # the tabs follow the arrow keys
    page.keyboard.press("Home")
    expect(page.get_by_role("tab", name="Try it")).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(page.get_by_role("tab", name="Teach")).to_have_attribute("aria-selected", "true")

    page.set_viewport_size({"width": 420, "height": 800})  # a narrow window: no sideways scrolling
    console.tab("Try it")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    console.shot("try-narrow")

    assert console.requests and not console.foreign_requests()


def test_planned_panels_light_up_when_the_api_offers_them(console: Console, stack: Stack) -> None:
    """The versions, suggestions and labels panels on canned answers (their routes are tested in
    tests/services), so that a rollback and two labelled suggestions need no trained model here."""
    from playwright.sync_api import expect

    task = {"name": "planned", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
    assert stack.http.post("/v1/tasks", json=task).status_code == 201
    page = console.page
    page.add_init_script(f"sessionStorage.setItem('openbook.apiKey', {json.dumps(KEY)});")
    page.add_init_script("sessionStorage.setItem('openbook.task', 'planned');")

    versions = {
        "versions": [
            {
                "version": v,
                "method": "prompt-ft",
                "state": state,
                "dev": {"accuracy": acc},
                "created": created,
            }
            for v, state, acc, created in [("v2", "serving", 0.8, 1.7e9), ("v1", "retired", 0.7, 1.6e9)]
        ]
    }
    suggestions = {
        "suggestions": [
            {"id": i, "text": text, "prediction": {"label": label, "probabilities": {"0": p0, "1": 1 - p0}}}
            for i, text, label, p0 in [
                (501, "an odd little film", "1", 0.49),
                (502, "not bad at all", "0", 0.52),
            ]
        ]
    }
    promoted: list[str] = []
    new_labels: list[dict] = []
    page.route("**/v1/tasks/planned/versions", lambda route: route.fulfill(json=versions))
    page.route("**/v1/tasks/planned/suggestions?n=10", lambda route: route.fulfill(json=suggestions))
    page.route(
        "**/v1/tasks/planned/versions/*/promote",
        lambda route: (promoted.append(route.request.url), route.fulfill(json={"version": "v1"})),
    )
    page.route(
        "**/v1/tasks/planned/labels",
        lambda route: (new_labels.append(route.request.post_data_json), route.fulfill(status=201, json={})),
    )
    open_console(console)
    expect(page.locator("#task-select")).to_have_value("planned")

    console.tab("Suggestions")
    first = page.locator("#suggestions li").first
    expect(first).to_be_focused()
    page.keyboard.press("2")  # 1..9 pick the labels in order: "2" is label 1
    expect(page.locator("#suggestions-status")).to_contain_text("Labelled #501 as 1")
    expect(page.locator('#suggestions li[data-id="502"]')).to_be_focused()
    page.keyboard.press("1")
    expect(page.locator("#suggestions-status")).to_contain_text("Labelled #502 as 0")
    assert {(e["id"], e["label"]) for e in stack.examples("planned")} == {(501, "1"), (502, "0")}

    console.tab("Training")
    expect(page.locator("#versions-card")).to_be_visible()
    expect(page.locator('#versions tr[data-version="v2"]')).to_contain_text("serving")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('#versions tr[data-version="v1"]').get_by_role("button", name="Roll back to it").click()
    expect(page.locator("#versions-status")).to_contain_text("Promoted v1")
    assert promoted and promoted[0].endswith("/v1/tasks/planned/versions/v1/promote")
    console.tab("Teach")
    page.locator("#new-label").fill("2")
    page.locator("#new-label-word").fill("neutral")
    page.get_by_role("button", name="Add label").click()
    expect(page.locator("#label-status")).to_contain_text("Added label 2")
    assert new_labels == [{"label": "2", "word": "neutral"}]

    # Deleting a task asks first; the api then no longer has it.
    console.tab("Tasks")
    expect(page.get_by_label("Train automatically every N new examples")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete this task…").click()
    expect(page.locator("#task-delete-status")).to_contain_text("Deleted planned")
    assert stack.http.get("/v1/tasks/planned").status_code == 404
    assert not console.foreign_requests()


def test_a_failed_job_and_a_refused_upload_are_shown(console: Console, stack: Stack) -> None:
    from playwright.sync_api import expect

    task = {"name": "failing", "template": "{text} It was {mask}", "labels": {"0": "bad", "1": "good"}}
    assert stack.http.post("/v1/tasks", json=task).status_code == 201
    page = console.page
    page.add_init_script(f"sessionStorage.setItem('openbook.apiKey', {json.dumps(KEY)});")
    page.add_init_script("sessionStorage.setItem('openbook.task', 'failing');")
    open_console(console)

    console.tab("Training")  # no examples: the worker takes the job and fails it
    page.locator("#train-method").fill("prompt-ft")
    page.locator("#train-steps").fill("2")
    page.get_by_role("button", name="Start training").click()
    job = page.locator("#jobs tbody tr").first
    expect(job).to_have_attribute("data-state", "failed", timeout=TRAINING_WAIT_MS)
    expect(job.locator(".job-result")).to_contain_text("at least 2 labels")

    # A server that refuses the second batch (say, a smaller body limit): the upload stops there.
    posts = []

    def second_batch_refused(route) -> None:
        posts.append(route.request.method)
        if route.request.method == "POST" and posts.count("POST") == 2:
            route.fulfill(status=413, json={"detail": "body of 4000 bytes is over the limit of 3000"})
        else:
            route.continue_()

    page.route("**/v1/tasks/failing/examples", second_batch_refused)
    console.tab("Teach")
    rows = [(f"film {i}", str(i % 2), i) for i in range(70)]
    page.locator("#upload-file").set_input_files(csv_file("big.csv", rows))
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#upload-status")).to_contain_text(
        "Stopped at batch 2 of 2 (rows 65–70): 413 body of 4000 bytes is over the limit of 3000"
    )
    assert [e["id"] for e in stack.examples("failing")] == list(range(64))
    assert not console.foreign_requests()


def fnv1a_53(text: str) -> int:
    """The reference for the console's example ids: 64-bit FNV-1a over UTF-8, the low 53 bits."""
    digest = 0xCBF29CE484222325
    for byte in text.encode():
        digest = ((digest ^ byte) * 0x100000001B3) % 2**64
    return digest % 2**53


def test_upload_checks_and_helpers_in_the_browser(static_console: Console) -> None:
    """The page's own parsing and arithmetic, run by the browser's JavaScript engine."""
    open_console(static_console)
    result = static_console.page.evaluate(
        """async () => {
          const upload = await import("/console/js/upload.js");
          const util = await import("/console/js/util.js");
          const health = await import("/console/js/health.js");
          const task = {labels: {"0": "bad", "1": "good"}};
          const csv = 'id,Text,label\\r\\n7,"a ""quoted"", comma, and\\nnewline",1\\r\\n,plain,0\\n';
          const rows = upload.readRows("x.csv", "\\uFEFF" + csv);
          const tsv = upload.readRows("x.tsv", "sentence\\tlabel\\nfine\\t1\\n");
          const more = [{line: 9, text: "x".repeat(5001), label: "1"}, {line: 10, text: "plain", label: "0"},
                        {line: 11, text: "y", label: "1", id: "2e3"}];
          const big = upload.checkRows(rows.concat(more), task, false);
          const many = Array.from({length: 130}, (_, i) => ({text: "t" + i, label: "0", id: i}));
          const pairs = upload.readRows("p.csv", "text_a,text_b,label\\nit rains,it is wet,1\\n,x,0\\n");
          const pairChecks = upload.checkRows(pairs, task, true);
          const array = upload.readRows("a.json", '[{"text": "fine", "label": 1, "id": 3}, 5]');
          return {
            rows, tsv, errors: big.errors.map((r) => [r.line, r.error]),
            pairs: pairChecks.rows.map((r) => [r.text, r.error]), array,
            sizes: upload.batches(many).map((b) => b.length),
            ids: [util.textId("plain"), util.textId(["it rains", "it pours"]), util.textId("café ☕")],
            p50: health.quantile(0.5, new Map([[0.1, 2], [0.2, 4], [Infinity, 4]])),
          };
        }"""
    )
    assert result["rows"] == [
        {"line": 2, "text": 'a "quoted", comma, and\nnewline', "label": "1", "id": "7"},
        {"line": 4, "text": "plain", "label": "0", "id": None},  # no id: one is made from the text
    ]
    assert result["tsv"] == [{"line": 2, "text": "fine", "label": "1", "id": None}]
    assert result["errors"] == [
        [9, "text of 5001 characters is over the limit of 5000"],
        [10, "the same text as line 4"],
        [11, 'id "2e3" is not a whole number ≥ 0'],
    ]
    assert result["pairs"] == [[["it rains", "it is wet"], None], [["", "x"], "empty text"]]
    assert result["array"] == [
        {"line": 1, "text": "fine", "label": 1, "id": 3},
        {"line": 2, "text": "", "label": "", "error": "not a JSON object"},
    ]
    assert result["sizes"] == [64, 64, 2]
    assert result["ids"] == [fnv1a_53("plain"), fnv1a_53("it rains\0it pours"), fnv1a_53("café ☕")]
    assert result["p50"] == pytest.approx(0.1)
