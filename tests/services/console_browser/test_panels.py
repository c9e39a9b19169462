"""The console's panels on canned answers, a failed job and a refused upload, in a real browser."""

from __future__ import annotations

import json

from tests.services.console_browser.page import (
    KEY,
    TRAINING_WAIT_MS,
    Console,
    Stack,
    csv_file,
    open_console,
    open_on_task,
)


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
    open_on_task(console, stack, task)
    page = console.page

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


def test_an_upload_that_creates_its_labels(console: Console, stack: Stack) -> None:
    """Unknown labels are row errors until the box is ticked; then the upload creates them, and the page
    shows the task's new labels."""
    from playwright.sync_api import expect

    task = {"name": "intents", "template": "{text} It was {mask}", "labels": ["book_flight", "transfer"]}
    open_on_task(console, stack, task)
    page = console.page
    console.tab("Teach")
    rows = [
        ("fly me to rome", "book_flight", 1),
        ("pay my phone bill", "pay_bill", 2),
        ("my pin", "pinChange", 3),
    ]
    page.locator("#upload-file").set_input_files(csv_file("intents.csv", rows))
    expect(page.locator("#upload-summary")).to_contain_text("2 of 3 rows have errors")
    expect(page.locator("#upload-preview")).to_contain_text('unknown label "pay_bill"')

    page.get_by_label("Create the labels the file brings").check()  # the same file, checked again
    expect(page.locator("#upload-summary")).to_contain_text(
        "3 rows, all good. Creates 2 label(s): pay_bill, pinChange"
    )
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#upload-status")).to_contain_text("Uploaded 3 rows: 3 new")
    labels = stack.http.get("/v1/tasks/intents").json()["labels"]
    assert labels == {
        "book_flight": "book flight",
        "transfer": "transfer",
        "pay_bill": "pay bill",
        "pinChange": "pin change",
    }
    page.locator("#add-label").fill("pin")  # the page read the task again: the picker offers its new label
    expect(page.locator("#add-form [role=option]")).to_have_text(["pinChange"])  # its word is its name
    expect(page.locator('#label-counts [data-label="pay_bill"]')).to_contain_text("1")
    assert not console.foreign_requests()
