"""tools/wheelhouse.py: the packages a host with no index needs, from what is installed here."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "tools" / "wheelhouse.py"
_SPEC = importlib.util.spec_from_file_location("wheelhouse", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
wheelhouse = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wheelhouse)


def test_the_closure_follows_requirements_at_the_installed_versions() -> None:
    from importlib.metadata import version

    packages = wheelhouse.closure(["fastapi"], "3.12")
    assert {"fastapi", "starlette", "pydantic", "pydantic-core", "anyio"} <= set(packages)
    assert packages["pydantic"] == version("pydantic")
    assert "torch" in wheelhouse.closure(["accelerate"], "3.12")  # found, then left to the host
    assert wheelhouse.HOST_PROVIDED.match("torch") and wheelhouse.HOST_PROVIDED.match("nvidia-cublas")
    assert not wheelhouse.HOST_PROVIDED.match("transformers")
    # markers are read for Linux: tqdm's Windows-only colorama and its extras' packages stay out
    assert set(wheelhouse.closure(["tqdm"], "3.12")) == {"tqdm"}


def test_the_requirements_files_pin_what_the_wheelhouse_starts_from() -> None:
    names = wheelhouse.requirement_names(_PATH.parents[1] / "requirements.txt")
    assert "torch" in names and "faiss-cpu" in names and all("#" not in n for n in names)
    with pytest.raises(SystemExit, match="not installed here"):
        wheelhouse.closure(["no-such-package-anywhere"], "3.12")
