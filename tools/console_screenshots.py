"""The console's screenshots in docs/, taken on a running stack with Playwright and Chromium at 1400 x 900.

    OPENBOOK_DATA_DIR=/tmp/shots OPENBOOK_PORT=8765 python -m services.cli up --demo &
    python tools/console_screenshots.py seed --base http://127.0.0.1:8765
    python tools/console_screenshots.py shots --base http://127.0.0.1:8765 --out docs

`seed` creates `clinc150`, a task of clinc150's 150 intents given by name (training by hand only), posts
its 10-per-intent training examples of seed 13 (from $OPENBOOK_DATA, ../shared/datasets by default),
and starts one job from the Training form left empty: the task's own budget. `shots` waits for that job
and for the demo task's, then takes docs/console.png (the demo task's Try it), docs/console-150.png (a
prediction at 150 labels), docs/console-150-report.png (its report) and docs/console-150-training.png
(the Training tab with the finished job). On a 2-core CPU the job takes ten minutes and more.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

DATA = Path(os.environ.get("OPENBOOK_DATA", Path(__file__).resolve().parents[2] / "shared" / "datasets"))
CLINC = DATA / "k-shot" / "clinc150"
TASK = "clinc150"
WINDOW = {"width": 1400, "height": 900}
DEMO_TEXTS = "What a lovely, funny film.\nThe plot made no sense at all."
TEXT = "i lost my card at the mall"
BATCH = 64
CHROMIUM = os.environ.get("OPENBOOK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def intents() -> list[str]:
    """The intents in label order: "0=accept reservations" -> accept_reservations."""
    lines = (CLINC / "labels.txt").read_text().splitlines()
    return [line.split("=", 1)[1].strip().replace(" ", "_") for line in lines if "=" in line]


def seed(base: str) -> None:
    names = intents()
    with httpx.Client(base_url=base, timeout=600) as http:
        task = {"name": TASK, "template": "Customer message: {text}\nIntent: {mask}", "labels": names}
        created = http.post("/v1/tasks", json={**task, "training": {"auto": False}})
        assert created.status_code in (201, 409), created.text
        with (CLINC / "10-13" / "train.csv").open() as rows:
            examples = [
                {"text": text, "label": names[int(label)], "id": i}
                for i, (label, text) in enumerate(csv.reader(rows))
            ]
        for first in range(0, len(examples), BATCH):
            answer = http.post(
                f"/v1/tasks/{TASK}/examples", json={"examples": examples[first : first + BATCH]}
            )
            assert answer.status_code == 201, answer.text
        print(f"{TASK}: {len(names)} labels, {len(examples)} examples")
    with browser_page() as page:  # a job from the Training form left empty: the task's own budget
        open_task(page, base, TASK, "training")
        page.get_by_role("button", name="Start training").click()
        page.wait_for_selector("#train-status[data-kind=ok]")
        print(page.locator("#train-status").inner_text())


@contextlib.contextmanager
def browser_page() -> Iterator:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=3_600_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport=WINDOW)
        page.set_default_timeout(600_000)
        yield page
        browser.close()


def open_task(page, base: str, name: str, tab: str) -> None:
    page.goto("about:blank")  # a load of its own: going from one #tab to another would not reload
    page.goto(f"{base}/#{tab}")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#task-select", name)


def _wait_for_jobs(http: httpx.Client, task: str) -> None:
    while any(job["state"] in ("queued", "running") for job in http.get(f"/v1/tasks/{task}/jobs").json()):
        time.sleep(10)


def shots(base: str, out: Path) -> None:
    from playwright.sync_api import expect

    with browser_page() as page, httpx.Client(base_url=base, timeout=600) as http:
        _wait_for_jobs(http, "sentiment")
        open_task(page, base, "sentiment", "try")
        page.get_by_label("Texts to classify, one per line").fill(DEMO_TEXTS)
        page.get_by_role("button", name="Classify").click()
        expect(page.locator(".demonstrations .demo-class")).to_have_count(4)  # two texts, two classes each
        page.screenshot(path=str(out / "console.png"))

        _wait_for_jobs(http, TASK)
        open_task(page, base, TASK, "training")
        expect(page.locator("#serving-version")).not_to_have_text("base")
        page.screenshot(path=str(out / "console-150-training.png"))
        open_task(page, base, TASK, "try")
        page.get_by_label("Texts to classify, one per line").fill(TEXT)
        page.get_by_role("button", name="Classify").click()
        expect(page.locator(".demonstrations .demo-class")).to_have_count(3)  # the most probable three
        page.screenshot(path=str(out / "console-150.png"), full_page=True)  # the whole page: 1,500 px
        open_task(page, base, TASK, "quality")
        expect(page.locator("#quality-report")).to_be_visible()
        page.screenshot(path=str(out / "console-150-report.png"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=["seed", "shots"])
    parser.add_argument("--base", default="http://127.0.0.1:8765")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    if args.step == "seed":
        seed(args.base)
    else:
        shots(args.base, args.out)


if __name__ == "__main__":
    main()
