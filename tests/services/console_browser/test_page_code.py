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
