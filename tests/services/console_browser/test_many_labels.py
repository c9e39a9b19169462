"""The console on a task of 150 labels (the size of clinc150's intents): a label picker that searches them,
keyboard only, and a report that reads as a list of confused pairs and a table worst first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services.console_browser.page import Console, Stack, open_on_task
from tests.services.test_many_labels import NAMES

PER_LABEL = 2
# Training by hand only: a version served by an automatic job midway would change the report under the test.
TASK = {"name": "intents", "template": "{text} Intent: {mask}", "labels": NAMES, "training": {"auto": False}}
EXAMPLES = [
    {"text": f"please {name.replace('_', ' my ')} number {k}", "label": name, "id": i * PER_LABEL + k}
    for i, name in enumerate(NAMES)
    for k in range(PER_LABEL)
]


@pytest.fixture(scope="module")
def stack_backbone(masked_dir: Path) -> Path:
    """The masked backbone scores 150 label words in one forward; a causal one needs a forward per word."""
    return masked_dir


def _worst_first(per_label: dict) -> list[str]:
    """The console's order, written again: lowest F1, then lowest recall, then by name; none scored last."""
    return sorted(
        per_label,
        key=lambda label: (
            per_label[label]["support"] == 0,
            per_label[label]["f1"],
            per_label[label]["recall"],
            label,
        ),
    )


def test_a_task_of_150_labels_picks_by_search_and_reports_its_confusions(
    console: Console, stack: Stack
) -> None:
    from playwright.sync_api import expect

    assert len(NAMES) == 150
    open_on_task(console, stack, TASK)
    for first in range(0, len(EXAMPLES), 64):  # the api's examples per POST
        batch = {"examples": EXAMPLES[first : first + 64]}
        assert stack.http.post("/v1/tasks/intents/examples", json=batch).status_code == 201
    page = console.page
    expect(page.locator("#task-summary")).to_contain_text("150 labels ·")  # not 150 names in the header

    # Teach: the label box narrows 150 labels to those holding "flight", and the keys pick one.
    console.tab("Teach")
    page.locator("#add-text").fill("get me a seat to lisbon on friday")
    box = page.get_by_role("combobox", name="Label (type to find it")
    box.fill("flight")
    options = page.locator("#add-form [role=option]")
    flights = [name for name in NAMES if "flight" in name]
    expect(options).to_have_count(len(flights))
    assert [o.get_attribute("data-label") for o in options.all()] == flights
    box.press("ArrowDown")  # the first is active as the list opens: down moves to the second
    expect(box).to_have_attribute("aria-activedescendant", options.nth(1).get_attribute("id"))
    expect(options.nth(1)).to_have_attribute("aria-selected", "true")
    console.shot("many-labels-picker")
    box.press("Enter")  # picks it, and closes the list
    expect(box).to_have_value(flights[1])
    expect(box).to_have_attribute("aria-expanded", "false")
    box.press("Enter")  # with the list closed, Enter submits the form
    expect(page.locator("#add-status")).to_contain_text("Added example")
    added = [e for e in stack.examples("intents") if e["text"] == "get me a seat to lisbon on friday"]
    assert [e["label"] for e in added] == [flights[1]] == ["cancel_flight"]

    # A label that matches nothing says so; the form then refuses to add, and says how to pick.
    page.locator("#add-text").fill("a text with no label yet")
    box.fill("zzz")
    expect(page.locator("#add-form .picker-options")).to_contain_text("No label matches")
    box.press("Escape")
    page.get_by_role("button", name="Add", exact=True).click()
    expect(page.locator("#add-status")).to_contain_text("Pick a label")

    # The examples shown narrow to one label picked from the same kind of box.
    examples_box = page.get_by_role("combobox", name="Label", exact=True)
    examples_box.fill("RESET_PASS")  # any case
    examples_box.press("Enter")  # the only match, active as the list opened
    expect(examples_box).to_have_value("reset_password")
    rows = page.locator("#examples-table tbody tr")
    expect(rows).to_have_count(PER_LABEL)
    for row in rows.all():
        expect(row.locator("td").nth(2)).to_have_text("reset_password")
    console.shot("many-labels-teach")

    # Try: ten most probable labels, and the correction is a picker too.
    console.tab("Try it")
    page.get_by_label("Texts to classify, one per line").fill("please pay my bill number 1")
    page.get_by_role("button", name="Classify").click()
    card = page.locator("article.prediction").first
    expect(card.locator(".prediction-body table").first.locator("tbody tr")).to_have_count(10)
    correct = card.get_by_role("combobox", name="Add “please pay my bill number 1” as an example of")
    correct.fill("pay_b")
    correct.press("Enter")  # pay_bill and pay_balance match: the first Enter asks, the second picks
    expect(card.locator(".picker-ask")).to_contain_text("Enter again picks pay_bill")
    correct.press("Enter")
    expect(card.locator(".correct .status")).to_contain_text("(pay_bill)")
    console.shot("many-labels-try")

    # Quality: the confused pairs as the report lists them, the per-label table worst first, the
    # 150 x 150 heatmap folded away.
    report = stack.http.get("/v1/tasks/intents/report").json()
    assert report["confused_pairs"], "a random tiny backbone over 150 labels confuses some"
    console.tab("Quality")
    pairs = page.locator("#quality-confused li")
    expect(pairs).to_have_count(len(report["confused_pairs"]))
    for item, pair in zip(pairs.all(), report["confused_pairs"], strict=True):
        expect(item).to_contain_text(f"{pair['label']} → {pair['predicted']}: {pair['count']}")
    expect(page.locator("#panel-quality h2", has_text="Per label")).to_contain_text("worst first")
    order = [row.get_attribute("data-label") for row in page.locator("#quality-labels tbody tr").all()]
    assert order == _worst_first(report["per_label"]) and len(order) == 150
    expect(page.locator("#quality-confusion table.confusion")).to_have_count(0)  # built when unfolded
    expect(page.locator("#quality-confusion summary")).to_have_text("The whole 150 × 150 matrix (scrolls)")
    console.shot("many-labels-report")

    # A suspect's "or as…" offers the labels but its own and the predicted one; the keys pick, the api
    # relabels. (This random backbone is never 50% sure, so the suspect is added to the real report.)
    suspect = {"id": 0, "text": EXAMPLES[0]["text"], "label": "book_flight", "predicted": "book_hotel"}

    def with_a_suspect(route) -> None:
        response = route.fetch()
        if response.status == 202:  # still scoring: its progress as it is
            route.fulfill(response=response)
            return
        route.fulfill(json={**response.json(), "suspect_examples": [{**suspect, "confidence": 0.9}]})

    page.route("**/v1/tasks/intents/report?*", with_a_suspect)
    page.get_by_role("button", name="Reload", exact=True).click()
    other = page.get_by_role("combobox", name="Relabel example 0 as another label")
    other.fill("flight")
    offered = page.locator("#quality-suspects [role=option]")
    expect(offered).to_have_count(len(flights) - 1)
    assert "book_flight" not in [o.get_attribute("data-label") for o in offered.all()]
    console.shot("many-labels-relabel")
    other.press("ArrowDown")
    with page.expect_response("**/v1/tasks/intents/report?*"):  # the report read again after the fix
        other.press("Enter")
    page.unroute("**/v1/tasks/intents/report?*")
    expect(page.locator("#suspects-status")).to_contain_text("Relabelled #0 as change_flight")
    assert {e["id"]: e["label"] for e in stack.examples("intents")}[0] == "change_flight"

    # Suggestions: past nine labels, no number keys but a picker per text.
    pool = {"texts": [{"id": 9001, "text": "my card was charged twice"}]}
    assert stack.http.post("/v1/tasks/intents/pool", json=pool).status_code == 201
    console.tab("Suggestions")
    expect(page.locator("#suggestion-keys")).to_contain_text("Type part of a label")
    label_as = page.get_by_role("combobox", name="Label “my card was charged twice” as")
    label_as.fill("report_card")
    console.shot("many-labels-suggestions")
    label_as.press("Enter")
    expect(page.locator("#suggestions-status")).to_contain_text("Labelled #9001 as report_card")
    assert {e["id"]: e["label"] for e in stack.examples("intents")}[9001] == "report_card"
    assert not console.foreign_requests()
