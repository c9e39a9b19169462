"""Write into a results directory's settings.json the settings it ran with but did not record.

`openbook eval` (and `continual`, `knn-selection`) resumes a directory only with the settings in its
settings.json. Directories written before the kNN scoring (`knn`) and the label scoring (`label_scoring`)
were recorded ran with cosine, unstandardised neighbours at T 0.1 and exact word scores, the only ones
there were; this writes those values in where the keys are missing, so that every directory says what
it ran and the commands need no rule for the older shape. Keys present are left as they are, so running
it twice changes nothing.

    python tools/spell_out_settings.py docs/results/*/settings.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

# What a directory's runs used, for each setting it predates.
RAN_BEFORE_RECORDED = {
    "knn": {"similarity": "cosine", "standardise": False, "temperature": 0.1},
    "label_scoring": "exact",
}


def spell_out(path: Path) -> list[str]:
    """Add the missing settings to the settings.json at `path` (a file, or the directory holding it);
    the keys added."""
    path = path / "settings.json" if path.is_dir() else path
    saved = json.loads(path.read_text())
    missing = [key for key in RAN_BEFORE_RECORDED if key not in saved]
    if missing:
        saved |= {key: RAN_BEFORE_RECORDED[key] for key in missing}
        path.write_text(json.dumps(saved, indent=2) + "\n")  # as the commands write it
    return missing


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="settings.json files, or the directories holding them"
    )
    for path in parser.parse_args(argv).paths:
        added = spell_out(path)
        print(f"{path}: added {', '.join(added)}" if added else f"{path}: complete")


if __name__ == "__main__":
    main()
