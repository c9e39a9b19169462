"""The benchmarks' client (`services/bench_client.py`) reads a classify's answers batch by batch: the
label, the version, and each reader's most likely label."""

from __future__ import annotations

import json

import httpx

from services.bench_client import BenchClient

ANSWERS = {  # text -> (label, p_lm, p_knn)
    "a": ("pos", {"neg": 0.6, "pos": 0.4}, {"neg": 0.1, "pos": 0.9}),
    "b": ("neg", {"neg": 0.3, "pos": 0.7}, {"neg": 0.8, "pos": 0.2}),
    "c": ("neg", {"neg": 0.9, "pos": 0.1}, None),  # no book to read: an empty store
}


def test_classify_reads_the_label_and_each_readers_most_likely_label_batch_by_batch() -> None:
    batches = []

    def answer(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["texts"]
        batches.append(texts)
        predictions = [{"label": ANSWERS[t][0], "p_lm": ANSWERS[t][1], "p_knn": ANSWERS[t][2]} for t in texts]
        return httpx.Response(200, json={"predictions": predictions, "model_version": f"v{len(batches)}"})

    client = BenchClient("http://api", max_batch=2)
    client.http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer))
    scored = client.classify("t", ["a", "b", "c"])
    assert batches == [["a", "b"], ["c"]]
    assert scored.labels == ["pos", "neg", "neg"] and scored.model_versions == ["v1", "v2"]
    assert scored.prompt_labels == ["neg", "pos", "neg"]
    assert scored.book_labels == ["pos", "neg", None]
