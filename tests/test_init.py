"""The public API in `openbook/__init__.py`: every exported name resolves, lazily."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import openbook
import pytest


def test_every_public_name_resolves_to_its_module_object() -> None:
    assert sorted(openbook.__all__) == sorted(openbook._EXPORTS)
    for name in openbook.__all__:
        module = importlib.import_module(openbook._EXPORTS[name])
        assert getattr(openbook, name) is getattr(module, name), name
    assert set(openbook.__all__) <= set(dir(openbook))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'openbook' has no attribute 'Nope'"):
        _ = openbook.Nope


@pytest.mark.parametrize("module", ["openbook", "openbook.data"])
def test_light_imports_do_not_import_torch(module: str) -> None:
    # In a fresh interpreter: this one imported torch long ago.
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'faiss') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
