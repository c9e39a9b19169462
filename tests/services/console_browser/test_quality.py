"""The Quality panel in a real browser: from a report to a relabelled suspect to a new report, and a
threshold chosen on the coverage curve written as the task's min_confidence."""

from __future__ import annotations

from tests.services.console_browser.page import TRAINING_WAIT_MS, Console, Stack, open_on_task

# Two clusters the tiny random model tells apart, the store alone judging (as tests/services/test_report.py).
WORDS = ("yes", "no", "so", "it", "a")
A = [f"{w} the movie was great and fun" for w in WORDS]
B = [f"{w} who wrote the book about the river" for w in WORDS]
MISLABELLED = 42
TASK = {
    "name": "clusters",
    "template": "{text} It was {mask}",
    "labels": {"a": "good", "b": "bad"},
    "knn": {"k": 3, "temperature": 0.01, "lam": 1.0},
}
EXAMPLES = [
    *({"text": t, "label": "a", "id": i} for i, t in enumerate(A)),
    *({"text": t, "label": "b", "id": 10 + i} for i, t in enumerate(B)),
    {"text": "the movie was great and fun", "label": "b", "id": MISLABELLED},
]


def test_relabelling_a_suspect_and_choosing_a_threshold(console: Console, stack: Stack) -> None:
    from playwright.sync_api import expect

    open_on_task(console, stack, TASK)
    page = console.page

    # Nothing labelled yet: the api's 409 is shown, and no empty report.
    console.tab("Quality")
    expect(page.locator("#quality-status")).to_contain_text("no labelled example")
    expect(page.locator("#quality-report")).to_be_hidden()

    assert stack.http.post("/v1/tasks/clusters/examples", json={"examples": EXAMPLES}).status_code == 201
    before = stack.http.get("/v1/tasks/clusters/report").json()
    page.get_by_role("button", name="Reload", exact=True).click()
    expect(page.locator("#quality-report")).to_be_visible()
    stat = page.locator('[data-stat="accuracy"] .stat-value')
    expect(stat).to_have_text(f"{100 * before['accuracy']:.1f}%")
    expect(page.locator('[data-stat="examples"] .stat-value')).to_have_text("11")
    expect(page.locator("#quality-scored-by")).to_have_text("leave-one-out")
    expect(page.locator("#quality-model")).to_have_text("base")
    # one calibration error, the served confidence's: unscaled, as the untrained model serves it
    ece = f"{before['calibration']['ece_before']:.3f}"
    expect(page.locator('[data-stat="ece"] .stat-value')).to_have_text(ece)
    expect(page.locator("#quality-calibration")).to_contain_text(
        f"Calibration error {ece}: the untrained model"
    )
    # each reader alone, beside the served accuracy
    readers = before["readers"]
    expect(page.locator("#quality-readers")).to_contain_text(
        f"the prompt {100 * readers['prompt']:.1f}%, the book of examples (keyed by slot vectors) "
        f"{100 * readers['book']:.1f}%; served, both read, the book weighted λ = {readers['lam']:.2f}: "
        f"{100 * before['accuracy']:.1f}%"
    )
    # The heatmap's counts and the reliability bars are the report's.
    labels, matrix = before["confusion"]["labels"], before["confusion"]["matrix"]
    for g, gold in enumerate(labels):
        for p, predicted in enumerate(labels):
            cell = page.locator(f'#quality-confusion td[data-gold="{gold}"][data-predicted="{predicted}"]')
            expect(cell).to_have_text(str(matrix[g][p]))
    filled = sum(1 for b in before["reliability"] if b["count"])
    expect(page.locator("#quality-reliability rect.bin")).to_have_count(filled)
    expect(page.locator("#quality-versions")).to_contain_text("No trained version yet")

    # The mislabelled example is the surest suspect, listed first.
    suspects = page.locator("#quality-suspects tbody tr")
    expect(suspects.first).to_have_attribute("data-id", str(MISLABELLED))
    expect(suspects.first).to_contain_text("the movie was great and fun")
    console.shot("quality")

    page.get_by_role("button", name=f"Relabel example {MISLABELLED} as a").click()
    expect(page.locator("#suspects-status")).to_contain_text(f"Relabelled #{MISLABELLED} as a")
    expect(page.locator(f'#quality-suspects tr[data-id="{MISLABELLED}"]')).to_have_count(0)
    after = stack.http.get("/v1/tasks/clusters/report").json()
    assert after["accuracy"] > before["accuracy"]
    assert {e["id"]: e["label"] for e in stack.examples("clusters")}[MISLABELLED] == "a"
    expect(stat).to_have_text(f"{100 * after['accuracy']:.1f}%")

    # The slider walks the coverage curve; the readout is the report's point at that threshold.
    slider = page.get_by_role("slider", name="Threshold")
    slider.focus()
    for _ in range(14):  # 0, 0.05, ...: fourteen steps up is 0.7
        page.keyboard.press("ArrowRight")
    expect(page.locator("#quality-threshold-value")).to_have_text("0.7")
    point = next(p for p in after["coverage"] if p["threshold"] == 0.7)
    answered = round(point["coverage"] * after["examples"])
    expect(page.locator("#quality-at-threshold")).to_contain_text(f"At 0.7: answers {answered} of 11")
    page.get_by_role("button", name="Use this threshold").click()
    expect(page.locator("#quality-current-threshold")).to_have_text("0.7")
    assert stack.http.get("/v1/tasks/clusters").json()["min_confidence"] == 0.7
    assert stack.http.get("/v1/tasks/clusters/report").json()["min_confidence"] == 0.7
    expect(page.locator("#quality-coverage line.current")).to_have_count(1)
    console.shot("quality-after")

    # Below the task's threshold Try shows the abstention, not an empty label. The threshold goes between
    # the confidences of the least and the most sure of a few probes, as the API gives them.
    probes = ["who wrote the movie", "the book", "the movie", "who wrote", "a book about the movie"]
    answer = stack.http.post("/v1/tasks/clusters/classify", json={"texts": probes}).json()["predictions"]
    sure = {text: max(p["probabilities"].values()) for text, p in zip(probes, answer, strict=True)}
    unsure, certain = min(probes, key=sure.get), max(probes, key=sure.get)
    assert sure[unsure] < sure[certain]
    threshold = (sure[unsure] + sure[certain]) / 2
    assert stack.http.patch("/v1/tasks/clusters", json={"min_confidence": threshold}).status_code == 200
    page.reload()
    console.tab("Try it")
    page.get_by_label("Texts to classify, one per line").fill(f"{unsure}\n{certain}")
    page.get_by_role("button", name="Classify").click()
    cards = page.locator("article.prediction header")
    expect(cards).to_have_count(2)
    expect(cards.first.locator(".label.abstained")).to_have_text("abstained")
    expect(cards.first).to_contain_text("its best guess,")
    certain_label = next(p["label"] for text, p in zip(probes, answer, strict=True) if text == certain)
    expect(cards.nth(1).locator(".label")).to_have_text(certain_label)
    console.shot("try-abstained")

    console.tab("Quality")
    page.get_by_role("button", name="Never abstain").click()
    expect(page.locator("#quality-min-confidence")).to_contain_text("never abstains")
    assert stack.http.get("/v1/tasks/clusters").json()["min_confidence"] is None

    # A trained version: the panel reports on its dev split, and lists it across versions.
    console.tab("Training")
    page.locator("#train-method").fill("prompt-ft")
    page.locator("#train-steps").fill("2")
    page.get_by_role("button", name="Start training").click()
    job = page.locator("#jobs tbody tr").first
    expect(job).to_have_attribute("data-state", "succeeded", timeout=TRAINING_WAIT_MS)
    version = job.locator(".job-version").inner_text()
    expect(page.locator("#serving-version")).to_have_text(version, timeout=TRAINING_WAIT_MS)
    console.tab("Quality")
    expect(page.locator("#quality-model")).to_have_text(version)
    expect(page.locator("#quality-scored-by")).to_have_text("dev")
    expect(page.locator(f'#quality-versions tr[data-version="{version}"]')).to_contain_text("serving")
    expect(page.locator("#quality-versions rect.version-bar.serving")).to_have_count(1)
    page.locator(f'#quality-versions tr[data-version="{version}"]').get_by_role(
        "button", name="Its report"
    ).click()
    expect(page.locator("#quality-version")).to_have_value(version)
    expect(page.locator("#quality-model")).to_have_text(version)
    console.shot("quality-versions")

    page.set_viewport_size({"width": 420, "height": 800})  # a narrow window: no sideways scrolling
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    console.shot("quality-narrow")
    assert not console.foreign_requests()
