"""Schemathesis hooks for tests/services/test_fuzz.py (the `st` command loads them: SCHEMATHESIS_HOOKS).

What no static schema can state is filled in here, for the cases schemathesis means to be valid only:
which tasks exist, which labels each has and whether it takes pairs; which templates, backbones, readers and
methods fit this server's backbone. Everything else a case holds is left as generated, so a schema-valid
request the app still refuses is a finding (ST202). Cases meant to be invalid are never touched.
"""

from __future__ import annotations

import itertools

import schemathesis

# The tasks test_fuzz.py creates before the run: name -> (takes pairs, labels).
TASKS = {"reviews": (False, ("0", "1")), "pairs": (True, ("yes", "no"))}
TEMPLATES = {False: "{text} It was {mask}", True: "{text_a} ? {text_b} Answer: {mask}"}
_FRESH = itertools.count()  # makes each label added a new one, with a word no other label has


@schemathesis.hook
def map_path_parameters(context, path_parameters: dict | None) -> dict | None:
    # A random task name only ever reaches the 404: steer most cases onto the tasks that exist.
    if path_parameters and "task" in path_parameters:
        name = str(path_parameters["task"])
        if not name.endswith("7"):
            path_parameters["task"] = list(TASKS)[len(name) % 2]
    return path_parameters


def _spare_the_known_tasks(case) -> None:
    # The rest of the run needs them as created: no case deletes one, or creates one anew with other labels.
    path, method = case.operation.path, case.method.upper()
    if path == "/v1/tasks/{task}" and method == "DELETE":
        name = (case.path_parameters or {}).get("task")
        if isinstance(name, str) and name in TASKS:
            case.path_parameters["task"] = f"{name}-other"
    if path == "/v1/tasks/{task}/labels/{label}" and method == "DELETE":
        task, label = (case.path_parameters or {}).get("task"), (case.path_parameters or {}).get("label")
        if task in TASKS and label in TASKS[task][1]:  # the examples the run posts use them
            case.path_parameters["label"] = f"{label}-other"
    if path == "/v1/tasks" and method == "POST" and isinstance(case.body, dict):
        name = case.body.get("name")
        if isinstance(name, str) and name in TASKS:
            case.body["name"] = f"{name}-other"


def _fit(text, pair: bool):
    parts = [text] if isinstance(text, str) else list(text)
    if not pair:
        return parts[0]
    return parts if len(parts) == 2 else [parts[0], parts[0]]


WORD_CHARS = 8  # of a generated label or word kept: see _distinct_words


def _distinct_words(labels, fresh: str):
    """Labels (label -> word, or names) whose words differ, which JSON Schema cannot say; a name's
    readable word begins with its own first word, `n<i>`. Each is cut to WORD_CHARS characters first:
    a word must leave the prompt room for a demonstration and the text, a length in tokens that no
    schema can state (a task whose words do not fit is refused with a 422, tested in test_api.py)."""
    if isinstance(labels, dict):
        return {
            f"{label[:WORD_CHARS]}{fresh}": f"{word[:WORD_CHARS]}{fresh}{i}"
            for i, (label, word) in enumerate(labels.items())
        }
    if isinstance(labels, list):
        return [f"n{i}{fresh}_{name[:WORD_CHARS]}" for i, name in enumerate(labels)]
    return labels


@schemathesis.hook
def map_case(context, case):
    _spare_the_known_tasks(case)
    if case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    path, body = case.operation.path, case.body
    if isinstance(body.get("training"), dict) and "method" in body["training"]:
        body["training"]["method"] = None  # the task's own, as for /train below
    if path == "/v1/tasks" and case.method.upper() == "POST":
        pair = len(str(body.get("name", ""))) % 2 == 1
        body["template"], body["backbone"], body["method"] = TEMPLATES[pair], None, "retroprompt"
        body["reader"] = "none"  # which sentence encoders this server may load is its own to say
        body["labels"] = _distinct_words(body.get("labels"), "")
        return case
    task = (case.path_parameters or {}).get("task")
    if task not in TASKS:
        return case
    pair, labels = TASKS[task]
    if path.endswith("/examples"):
        for i, example in enumerate(body.get("examples", [])):
            example["text"] = _fit(example["text"], pair)
            example["label"] = labels[len(str(example.get("label"))) % 2]
            if example.get("id") is not None:  # ids must differ within a batch, which JSON Schema cannot say
                example["id"] = example["id"] // 64 * 64 + i
    elif path.endswith("/pool") and case.method.upper() == "POST":
        for i, text in enumerate(body.get("texts", [])):
            text["text"] = _fit(text["text"], pair)
            text["id"] = text["id"] // 64 * 64 + i  # ids must differ within a batch
    elif path.endswith("/labels") and case.method.upper() == "POST":
        fresh = next(_FRESH)
        if "label" in body:
            body["label"] = f"{body['label']}-{fresh}"  # its readable word ends in `fresh` too
        if "word" in body:
            body["word"] = f"{body['word']}{fresh}"
        body["labels"] = _distinct_words(body.get("labels"), f"-{fresh}")
    elif path.endswith("/classify"):
        body["texts"] = [_fit(text, pair) for text in body.get("texts", [])]
    elif path.endswith("/demonstrations"):
        body["text"] = _fit(body["text"], pair)
    elif path.endswith("/train"):
        body["method"] = None  # the task's own; which methods fit a backbone is the registry's to say
    return case
