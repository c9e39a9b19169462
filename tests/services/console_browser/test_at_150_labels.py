"""The console at 150 labels, as a new user meets it (issue 64), in a 1400 x 900 window: a prediction and
why, a correction undone, the report with its progress, the Training tab from a job started with the
task's own settings to the version it made loading, then served, with one accuracy everywhere.

The labels are clinc150's intent names where its labels file is at hand (read here, never copied into
the repository), else 150 made-up ones; two examples each, on the tiny masked backbone.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.services.console_browser.page import KEY, ROOT, TRAINING_WAIT_MS, Console, Stack, open_console
from tests.services.test_many_labels import NAMES as MADE_UP_NAMES

CLINC_LABELS = (
    Path(os.environ.get("OPENBOOK_DATA", ROOT.parent / "shared" / "datasets")) / "k-shot/clinc150/labels.txt"
)
PER_LABEL = 2
BATCH = 64  # the api's examples per POST
WINDOW = {"width": 1400, "height": 900}
TEXT = "i lost my card at the mall"
# The task's own training settings: a budget of 2 steps, which a job started from the empty form must run.
TRAINING = {"auto": False, "steps": 2, "batch_size": 8, "lr": 1e-3, "eval_every": 2}


def label_names() -> list[str]:
    """clinc150's 150 intent names ("0=accept reservations" -> accept_reservations), else made-up ones."""
    if not CLINC_LABELS.is_file():
        return MADE_UP_NAMES
    lines = CLINC_LABELS.read_text().splitlines()
    return [line.split("=", 1)[1].strip().replace(" ", "_") for line in lines if "=" in line]


NAMES = label_names()
TASK = {"name": "intents150", "template": "{text} Intent: {mask}", "labels": NAMES, "training": TRAINING}
# A fragment that more than one label holds: the picker's first Enter must ask which.
FRAGMENT = next(f for f in ("lost", "flight") if sum(f in name for name in NAMES) > 1)
FIRST_MATCH = next(name for name in NAMES if FRAGMENT in name)


@pytest.fixture(scope="module")
def stack_backbone(masked_dir: Path) -> Path:
    """The masked backbone scores 150 label words in one forward; a causal one needs a forward per word."""
    return masked_dir


@pytest.fixture(scope="module")
def task(stack: Stack) -> dict:
    assert len(NAMES) == 150
    assert stack.http.post("/v1/tasks", json=TASK).status_code == 201
    examples = [
        {"text": f"{name.replace('_', ' ')} please, case {k}", "label": name, "id": i * PER_LABEL + k}
        for i, name in enumerate(NAMES)
        for k in range(PER_LABEL)
    ]
    for first in range(0, len(examples), BATCH):
        batch = {"examples": examples[first : first + BATCH]}
        assert stack.http.post(f"/v1/tasks/{TASK['name']}/examples", json=batch).status_code == 201
    return TASK


def open_on(console: Console) -> None:
    page = console.page
    page.set_viewport_size(WINDOW)
    page.add_init_script(f"sessionStorage.setItem('openbook.apiKey', {json.dumps(KEY)});")
    page.add_init_script(f"sessionStorage.setItem('openbook.task', {json.dumps(TASK['name'])});")
    open_console(console)


def fits_the_window(console: Console) -> bool:
    return console.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_prediction_reads_at_150_labels_and_a_correction_can_be_undone(
    console: Console, stack: Stack, task: dict
) -> None:
    from playwright.sync_api import expect

    open_on(console)
    page = console.page
    expect(page.locator("#task-summary")).to_contain_text("150 labels ·")
    page.get_by_label("Texts to classify, one per line").fill(TEXT)
    with page.expect_response("**/classify") as answered:
        page.get_by_role("button", name="Classify").click()
    prediction = answered.value.json()["predictions"][0]
    card = page.locator("article.prediction").first
    rows = card.locator(".prediction-body table").first.locator("tbody tr")
    expect(rows).to_have_count(10)

    # A label shown once: a task given by names scores each by its readable word, which says nothing more.
    top = rows.first.get_attribute("data-label")
    expect(rows.first.locator("th")).to_have_text(top)
    expect(card.locator(".label-word")).to_have_count(0)
    name = rows.first.locator(".label-name")
    expect(name).to_have_attribute("title", top)  # the whole name on hover, however it is cut
    assert name.locator(".label-text").evaluate("(n) => getComputedStyle(n).textOverflow") == "ellipsis"

    # The neighbours' similarity says its scale; the demonstrations show the most probable classes only, on
    # their own scale, and say that this model does not read them.
    expect(card.locator(".neighbours th").nth(2)).to_have_text("centred cosine")
    demos = card.locator(".demonstrations")
    expect(demos.locator("summary").first).to_have_text(
        "Nearest examples per class (this model reads no demonstrations)"
    )
    shown = demos.locator(".demos > .demo-class")
    expect(shown).to_have_count(3)
    p = prediction["probabilities"]
    most_probable = sorted(NAMES, key=lambda label: -p[label])[:3]
    assert [c.get_attribute("data-label") for c in shown.all()] == most_probable
    expect(demos.locator(".demo-scale")).to_contain_text("Plain cosine")
    demos.get_by_text("The other 147 classes").click()
    expect(demos.locator(".demo-class")).to_have_count(150)
    assert fits_the_window(console)
    console.shot("150-try")

    # The picker's first Enter over several matches asks; the second adds; Undo takes the example back.
    before = len(stack.examples(task["name"]))
    box = card.get_by_role("combobox", name=f"Add “{TEXT}” as an example of")
    box.fill(FRAGMENT)
    box.press("Enter")
    expect(card.locator(".picker-ask")).to_contain_text(f"Enter again picks {FIRST_MATCH}")
    assert len(stack.examples(task["name"])) == before  # nothing written on the first Enter
    box.press("Enter")
    expect(card.locator(".correct .status")).to_contain_text(f"({FIRST_MATCH})")
    assert [e["label"] for e in stack.examples(task["name"]) if e["text"] == TEXT] == [FIRST_MATCH]
    toast = page.locator(".toast")
    expect(toast).to_contain_text("Added as example")
    console.shot("150-try-undo")
    toast.get_by_role("button", name="Undo").click()
    expect(card.locator(".correct .status")).to_contain_text("Undone")
    assert [e for e in stack.examples(task["name"]) if e["text"] == TEXT] == []
    assert len(stack.examples(task["name"])) == before
    assert not console.foreign_requests()


def test_the_report_shows_its_progress_and_one_calibration_error(
    console: Console, stack: Stack, task: dict
) -> None:
    from playwright.sync_api import expect

    report = stack.http.get(f"/v1/tasks/{task['name']}/report").json()
    open_on(console)
    page = console.page
    # The api answers 202 with the examples scored so far while the report is computed
    # (tests/services/test_report.py); two such answers here, then the report.
    pending = {"task": task["name"], "stage": "leave-one-out", "scored": 150, "examples": 300}
    pending |= {"progress": 0.5, "elapsed_s": 4.0}
    asked: list[str] = []

    def slow(route) -> None:
        asked.append(route.request.url)
        if len(asked) <= 2:
            route.fulfill(status=202, json=pending, headers={"Retry-After": "1"})
        else:
            route.fallback()

    page.route("**/v1/tasks/intents150/report?*", slow)
    console.tab("Quality")
    expect(page.locator("#quality-status")).to_contain_text(
        "Scoring leave-one-out: 150 of 300 examples (50.0%)"
    )
    expect(page.locator("#quality-progress progress")).to_have_attribute("value", "0.5")
    console.shot("150-report-progress")
    expect(page.locator("#quality-report")).to_be_visible()
    expect(page.locator("#quality-progress")).to_be_hidden()
    assert all("wait=false" in url for url in asked) and len(asked) >= 3  # the api's own 202s, if slow

    # One calibration error: the confidence as served (unscaled while untrained), and what scaling would do.
    ece = f"{report['calibration']['ece_before']:.3f}"
    expect(page.locator('[data-stat="ece"] .stat-value')).to_have_text(ece)
    expect(page.locator("#quality-calibration")).to_contain_text(f"Calibration error {ece}")
    labels = page.locator("#quality-labels tbody tr")
    expect(labels).to_have_count(150)
    expect(page.locator("#quality-labels .label-word")).to_have_count(0)
    assert fits_the_window(console)
    console.shot("150-report")

    # Teach: the labels with the fewest examples first, a few dozen of them, then all on asking; no box
    # that scrolls out of sight.
    console.tab("Teach")
    chips = page.locator("#label-counts .count")
    expect(chips).to_have_count(24)
    expect(page.locator("#label-counts-note")).to_have_text("24 of 150 labels, the fewest examples first.")
    page.get_by_role("button", name="Show all 150 labels").click()
    expect(chips).to_have_count(150)
    assert page.locator("#label-counts").evaluate("(n) => n.scrollHeight <= n.clientHeight")
    assert not console.foreign_requests()


def test_a_job_from_the_empty_form_trains_as_the_task_does_and_its_version_loads_then_serves(
    console: Console, stack: Stack, task: dict
) -> None:
    from playwright.sync_api import expect

    open_on(console)
    page = console.page
    console.tab("Training")
    steps = page.get_by_label("Steps")
    expect(steps).to_have_value("")
    expect(page.locator("#train-budget")).to_contain_text(
        "trains as the task's own jobs do: retroprompt, 2 steps"
    )

    # The first polls of the job say it is finishing: a stage with no count, shown as a moving bar.
    polls = {"n": 0}

    def finishing(route) -> None:
        polls["n"] += 1
        if polls["n"] > 2:
            route.fallback()
            return
        record = route.fetch().json()
        route.fulfill(json={**record, "state": "running", "stage": "finishing", "progress": 1.0})

    page.route("**/v1/jobs/*", finishing)
    # The api keeps serving the base model until the test lets the new version through.
    held = {"on": True}

    def serving_base(route) -> None:
        text = route.fetch().text()
        if held["on"]:
            text = re.sub(r'(openbook_task_version_info\{[^}]*model=")[^"]*(")', r"\1base\2", text)
        route.fulfill(body=text, headers={"Content-Type": "text/plain"})

    page.route("**/metrics", serving_base)
    with page.expect_request("**/v1/tasks/intents150/train") as sent:
        page.get_by_role("button", name="Start training").click()
    assert sent.value.post_data_json == {}  # nothing typed: nothing sent, the task's settings apply
    job = page.locator("#jobs tbody tr").first
    expect(job.locator(".job-state")).to_contain_text("running · finishing")
    expect(job.locator(".job-state .stage-note")).to_contain_text("kNN and calibration chosen on dev")
    expect(job.locator(".job-progress progress:not([value])")).to_have_count(1)
    console.shot("150-training-finishing")

    expect(job).to_have_attribute("data-state", "succeeded", timeout=TRAINING_WAIT_MS)
    record = stack.http.get(f"/v1/jobs/{job.get_attribute('data-job')}").json()
    assert record["train_config"]["steps"] == 2 and record["metrics"]["steps_run"] == 2
    version = record["published"]["version"]
    served = f"{100 * record['gate']['candidate']:.1f}%"
    expect(job.locator(".job-result")).to_contain_text(f"version {version} · dev accuracy {served} · 2 steps")
    expect(job.locator(".job-verdict")).to_contain_text("first version")
    expect(job.locator(".job-details dl")).to_be_hidden()  # the record on demand

    # Loading: listed at once, said to be loading, the base model serving meanwhile.
    expect(page.locator("#serving-loading")).to_contain_text(f"Version {version} loading into the api")
    row = page.locator(f'#versions tr[data-version="{version}"]')
    expect(row.locator(".version-state")).to_have_text("serving next: loading into the api…")
    held["on"] = False
    expect(page.locator("#serving-version")).to_have_text(version, timeout=TRAINING_WAIT_MS)
    expect(page.locator("#serving-loading")).to_have_count(0)
    expect(row.locator(".version-state")).to_have_text("serving")
    expect(row).to_contain_text(served)
    assert fits_the_window(console)
    console.shot("150-training")

    # One accuracy for the version everywhere: the report's, the versions' and the gate's are one figure.
    console.tab("Quality")
    expect(page.locator("#quality-model")).to_have_text(version)
    expect(page.locator('[data-stat="accuracy"] .stat-value')).to_have_text(served)
    quality_row = page.locator(f'#quality-versions tr[data-version="{version}"]')
    expect(quality_row).to_contain_text(served)
    ece = page.locator('[data-stat="ece"] .stat-value').inner_text()
    expect(quality_row).to_contain_text(ece)
    expect(page.locator("#quality-versions .chart text.count")).to_have_text([served])
    assert fits_the_window(console)
    assert not console.foreign_requests()
