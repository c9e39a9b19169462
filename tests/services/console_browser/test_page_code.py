"""The console's own JavaScript (parsing, ids, arithmetic), run by the browser on its static files."""

from __future__ import annotations

import pytest

from tests.services.console_browser.page import Console, open_console


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
          const named = [{line: 2, text: "fly", label: "book_flight"}, {line: 3, text: "ok", label: "1"},
                         {line: 4, text: "pay", label: "pay_bill"},
                         {line: 5, text: "fly me", label: "book_flight"}, {line: 6, text: "huh", label: " "}];
          const creating = upload.checkRows(named, task, false, true);
          const refusing = upload.checkRows(named, task, false);
          return {
            newLabels: creating.newLabels, creatingErrors: creating.errors.map((r) => [r.line, r.error]),
            refusingErrors: refusing.errors.map((r) => r.line), refusingNew: refusing.newLabels,
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
    assert result["newLabels"] == ["book_flight", "pay_bill"]  # in the order the rows name them
    assert result["creatingErrors"] == [[6, "empty label"]]
    assert result["refusingErrors"] == [2, 4, 5, 6] and result["refusingNew"] == []
    assert result["sizes"] == [64, 64, 2]
    assert result["ids"] == [fnv1a_53("plain"), fnv1a_53("it rains\0it pours"), fnv1a_53("café ☕")]
    assert result["p50"] == pytest.approx(0.1)


def test_quality_charts_draw_the_numbers_they_are_given(static_console: Console) -> None:
    """The Quality panel's SVG charts: empty bins and unanswered thresholds are left out, bars and lines
    sit where their numbers say."""
    open_console(static_console)
    result = static_console.page.evaluate(
        """async () => {
          const charts = await import("/console/js/charts.js");
          const bin = (lower, count, confidence, accuracy) =>
            ({lower, upper: lower + 0.1, count, confidence, accuracy});
          const bins = [bin(0, 0, null, null), bin(0.5, 4, 0.55, 0.5), bin(0.9, 6, 0.95, 1)];
          const reliability = charts.reliabilityChart(bins);
          const bars = [...reliability.querySelectorAll("rect.bin")].map((r) => +r.getAttribute("height"));
          const curve = [0, 0.5, 1].map((threshold, i) =>
            ({threshold, coverage: 1 - i / 2, accuracy: i < 2 ? 0.8 : null}));
          const coverage = charts.coverageChart(curve, 0.5, null);
          const withTask = charts.coverageChart(curve, 0.5, 0.75);
          const points = (svg, name) => svg.querySelector(`polyline.${name}`).getAttribute("points");
          const count = (svg, selector) => svg.querySelectorAll(selector).length;
          const versions = charts.versionsChart(
            [{version: "v1", state: "retired", accuracy: 0.5}, {version: "v2", state: "serving"}]);
          return {
            bars, diagonal: count(reliability, "line.diagonal"),
            coverage: points(coverage, "coverage").split(" ").length,
            accuracy: points(coverage, "accuracy").split(" ").length,
            cursor: coverage.querySelector("line.cursor").getAttribute("x1"),
            current: [count(coverage, "line.current"), count(withTask, "line.current")],
            versionBars: count(versions, "rect.version-bar"),
          };
        }"""
    )
    assert len(result["bars"]) == 2  # the empty bin has no bar
    assert result["bars"][1] == pytest.approx(2 * result["bars"][0])  # accuracy 1 is twice accuracy 0.5
    assert result["diagonal"] == 1
    assert (result["coverage"], result["accuracy"]) == (3, 2)  # nothing answered at 1: no accuracy point
    assert float(result["cursor"]) == pytest.approx((42 + 348) / 2)  # halfway along the x axis
    assert result["current"] == [0, 1]
    assert result["versionBars"] == 1  # a version with no dev accuracy has no bar


def test_label_picker_searches_and_picks_with_the_keys(static_console: Console) -> None:
    """The label picker on its own: a substring of a label or its word in any case narrows the list, the
    arrows wrap around it, Enter picks, Escape closes, and excluded labels are never offered. A word is
    shown beside its label only where it says more than the name. Over several matches that the arrows
    did not choose from, the first Enter asks which, and the second picks."""
    from playwright.sync_api import expect

    open_console(static_console)
    page = static_console.page
    page.evaluate(
        """async () => {
          const { LabelPicker } = await import("/console/js/labelpicker.js");
          window.picked = [];
          const picker = new LabelPicker({ id: "probe", name: "Probe", exclude: ["pay_bill"],
                                          onPick: (label) => window.picked.push(label) });
          picker.setLabels({ book_flight: "book flight", cancel_flight: "cancel flight", pay_bill: "pay bill",
                             pinChange: "pin change", Flight_status: "status" });
          document.body.prepend(picker.node);
        }"""
    )
    box = page.get_by_role("combobox", name="Probe")
    options = page.locator("#probe ~ [role=listbox] [role=option]")
    box.fill("FLIGHT")
    expect(options).to_have_text(["book_flight", "cancel_flight", "Flight_status · status"])
    box.fill("n ch")  # in the word, not the label
    expect(options).to_have_text(["pinChange"])
    box.fill("bill")  # excluded
    expect(options).to_have_count(0)
    expect(page.locator("#probe ~ [role=listbox]")).to_contain_text("No label matches")
    box.fill("flight")
    box.press("ArrowUp")  # from the first, up wraps to the last
    expect(options.nth(2)).to_have_attribute("aria-selected", "true")
    box.press("ArrowDown")
    box.press("ArrowDown")
    expect(box).to_have_attribute("aria-activedescendant", options.nth(1).get_attribute("id"))
    box.press("Escape")
    expect(box).to_have_attribute("aria-expanded", "false")
    assert page.evaluate("window.picked") == []
    box.press("ArrowDown")  # opens again, on the first
    box.press("ArrowDown")
    box.press("Enter")
    expect(box).to_have_value("cancel_flight")
    assert page.evaluate("window.picked") == ["cancel_flight"]

    # Typed, not chosen: three labels hold "flight", so Enter asks before it picks the first.
    box.fill("flight")
    box.press("Enter")
    question = page.locator("#probe ~ .picker-ask")
    expect(question).to_have_text(
        "3 labels match “flight”: Enter again picks book_flight; ↓ ↑ choose one of the other 2."
    )
    assert page.evaluate("window.picked") == ["cancel_flight"]  # nothing picked yet
    box.press("Enter")
    expect(box).to_have_value("book_flight")
    expect(question).to_be_hidden()
    assert page.evaluate("window.picked") == ["cancel_flight", "book_flight"]
    box.fill("pin")  # one match: the first Enter picks it
    box.press("Enter")
    assert page.evaluate("window.picked") == ["cancel_flight", "book_flight", "pinChange"]


def test_per_label_scores_are_ordered_worst_first(static_console: Console) -> None:
    """Lowest F1 first, ties broken by the lower recall, then by name; labels never scored come last."""
    open_console(static_console)
    order = static_console.page.evaluate(
        """async () => {
          const { worstFirst } = await import("/console/js/quality.js");
          const s = (f1, recall, support) => ({ precision: 0, recall, f1, support });
          return worstFirst({ good: s(0.9, 0.9, 3), unseen: s(0, 0, 0), tie_b: s(0.5, 0.4, 2),
                              tie_a: s(0.5, 0.4, 2), low_recall: s(0.5, 0.2, 2), zero: s(0, 0, 4) })
            .map(([label]) => label);
        }"""
    )
    assert order == ["zero", "low_recall", "tie_a", "tie_b", "good", "unseen"]


def test_the_loss_curve_keeps_the_prompts_training_alone(static_console: Console) -> None:
    open_console(static_console)
    curves = static_console.page.evaluate(
        """async () => {
          const { keepLoss } = await import("/console/js/training.js");
          const seen = [
            {stage: "preparing"},
            {stage: "reader", progress: 0.5, loss: 3.1}, {stage: "reader", progress: 1, loss: 2.7},
            {stage: "training", progress: 0.25, loss: 0.9}, {stage: "training", progress: 0.25, loss: 0.8},
            {stage: "training", progress: 0.5, loss: "0.6"}, {stage: "finishing", progress: 1, loss: 0.5},
            {stage: "reader-again", progress: 0.5, loss: 2.9},
          ];
          let losses = [], before = {};
          const after = [];
          for (const record of seen) {
            losses = keepLoss(losses, before, record);
            before = record;
            after.push([...losses]);
          }
          return after;
        }"""
    )
    assert curves[2] == []  # the reader's tuning draws nothing
    assert curves[3] == [0.9] and curves[4] == [0.9]  # one point per progress step
    assert curves[5] == [0.9, 0.6] and curves[-1] == [0.9, 0.6]  # kept through the stages after
