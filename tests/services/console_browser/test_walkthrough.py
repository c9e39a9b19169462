"""The console walked through in a real browser, from a new task to a trained version."""

from __future__ import annotations

from tests.services.console_browser.page import KEY, TRAINING_WAIT_MS, Console, Stack, csv_file, open_console


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
    assert spec["reader"] is None  # the form's second reader left empty
    console.tab("Tasks")
    expect(page.locator("#task-spec")).to_contain_text("none: the prompt's slot vectors key the examples")

    console.tab("Teach")
    expect(page.locator("#label-form")).to_be_visible()  # the api can add labels
    for text, label in [("a good film with a great cast", "1"), ("it was terrible and boring", "0")]:
        page.locator("#add-text").fill(text)
        page.locator("#add-label").fill(label)  # the picker narrows the labels to it
        page.locator(f'#add-form [role=option][data-label="{label}"]').click()
        before = page.locator("#add-status").inner_text()  # the last add's "Added example #N."
        page.get_by_role("button", name="Add", exact=True).click()
        expect(page.locator("#add-status")).not_to_have_text(before)  # this add's answer, not the last's
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
