"""The method registry and spec parsing (`methods/base.py`)."""

from __future__ import annotations

import pytest
from openbook.methods import METHODS, build_method


def test_method_specs() -> None:
    assert set(METHODS) >= {"prompt-ft", "retroprompt"}
    method = build_method("retroprompt/no-demos/beta=0.5")
    assert method.config.demos is False and method.config.beta == 0.5
    assert method.spec == "retroprompt/no-demos/beta=0.5"
    assert (
        build_method("retroprompt/no-knn-infer").config.training_key()
        == build_method("retroprompt").config.training_key()
    )
    for bad, match in [
        ("nope", "unknown method"),
        ("prompt-ft/no-demos", "no option"),
        ("retroprompt/beta=x", "not a valid float"),
        ("retroprompt/beta=-1", "non-negative"),
        ("retroprompt/beta", "needs a value"),
    ]:
        with pytest.raises(ValueError, match=match):
            build_method(bad)
