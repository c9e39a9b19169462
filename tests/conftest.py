"""The builders tests share, as fixtures (test modules import nothing from each other or from here).

Tiny random backbones built from configs and saved/loaded through the real code path; the sentiment toy
set and its prompt; toy tasks on disk in the k-shot layout; a few tiny training steps for the command
lines; and the evaluation data under $OPENBOOK_DATA, for the few tests that read it. Random knowledge
stores and tiny sentence encoders are tests/fixtures/'s, registered below.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from openbook.encoders import DEFAULT_READER_ENV, NO_READER
from openbook.prompting import Template, Verbalizer

from tests.toy_datasets import ToyDatasets

# Tests run with no default reader: most build tiny backbones and need no sentence encoder. A test that
# wants one names it; tests/test_defaults.py makes a tiny one the default, and tests/test_encoders.py
# reads the default unset.
os.environ[DEFAULT_READER_ENV] = NO_READER

# The builders of their own modules, registered here: random knowledge stores, tiny sentence encoders.
pytest_plugins = ["tests.fixtures.stores", "tests.fixtures.encoders"]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs a worker per core), each worker's torch and FAISS take one
    thread, so that the workers do not oversubscribe the cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import faiss

        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)


CORPUS = [
    "the movie was great and fun",
    "it was terrible and boring",
    "a good film with a great cast",
    "a bad film , it was awful",
    "what is the answer to this question",
    "who wrote the book about the river",
    "where is the city of light",
    "the plot was okay , not good , not bad",
    "yes it is true",
    "no it is false",
] * 3


# The tiny causal models' sizes (Llama, and Gemma 3 on the same tokenizer).
TINY_DECODER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _save_causal(directory: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<pad>", "<s>", "</s>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **TINY_DECODER)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _save_masked(directory: Path) -> Path:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    # A fixed vocabulary (specials, the corpus's words, its characters) rather than a trained one:
    # WordPiece training breaks ties in hash order, so a trained vocabulary differs between sessions.
    words = sorted({word for line in CORPUS for word in line.split()})
    chars = sorted({char for line in CORPUS for char in line if not char.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    vocab += [w for w in words if w not in vocab]
    wordpiece = BertWordPieceTokenizer({token: i for i, token in enumerate(vocab)})
    tokenizer = BertTokenizerFast(
        tokenizer_object=wordpiece._tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
    )
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _save_gemma(directory: Path, tokenizer_dir: Path, **overrides) -> Path:
    """A tiny Gemma 3 on the tiny Llama's tokenizer: its embedding module scales by sqrt(hidden size).
    `overrides` replace config entries (window, layer types, ...)."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        head_dim=8,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **(TINY_DECODER | {"sliding_window": 16} | overrides),
    )
    Gemma3ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _sharpen(source: Path, target: Path) -> Path:
    """A tiny model re-initialised with 15x larger weights, its tokenizer kept.

    At the default scale (0.02) a random model's slot output hardly depends on its context, so no
    prompt vector could move the loss of a frozen backbone; at 0.3 attention is peaked and a prompt has
    something to steer. The prompt methods that freeze the backbone train on these.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    config = AutoConfig.from_pretrained(source)
    config.initializer_range = 0.3
    auto = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
    torch.manual_seed(0)
    auto.from_config(config).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_causal(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def masked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_masked(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def gemma_dir(causal_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_gemma(tmp_path_factory.mktemp("tiny-gemma3"), causal_dir)


@pytest.fixture(scope="session")
def mixed_gemma_dir(causal_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 with a sliding layer, window 4 (every prompt outgrows it), then a full one; peaked
    attention (initializer_range 0.3), so that a position seen or not changes the outputs."""
    return _save_gemma(
        tmp_path_factory.mktemp("tiny-gemma3-mixed"),
        causal_dir,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.3,
    )


def _load(directory: Path):
    from openbook.backbone import BackboneConfig, load_backbone

    return load_backbone(BackboneConfig(name=str(directory), max_length=48))


@pytest.fixture(params=["masked", "causal"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    """Each tiny backbone's directory in turn."""
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="session")
def causal_backbone(causal_dir: Path):
    return _load(causal_dir)


@pytest.fixture(scope="session")
def masked_backbone(masked_dir: Path):
    return _load(masked_dir)


@pytest.fixture(scope="session")
def gemma_backbone(gemma_dir: Path):
    return _load(gemma_dir)


@pytest.fixture(scope="session")
def albert_dir(masked_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ALBERT: its input embeddings (16) are narrower than its hidden states (32)."""
    from transformers import AlbertConfig, AlbertForMaskedLM, AutoTokenizer

    directory = tmp_path_factory.mktemp("tiny-albert")
    tokenizer = AutoTokenizer.from_pretrained(masked_dir)
    config = AlbertConfig(
        vocab_size=len(tokenizer),
        embedding_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    AlbertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session", params=["masked", "causal"])
def backbone(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_backbone")


@pytest.fixture(scope="session", params=["masked", "causal", "gemma"])
def any_backbone(request: pytest.FixtureRequest):
    """`backbone`, and the tiny Gemma 3, whose embedding module scales its table: for the code that builds
    input embeddings itself."""
    return request.getfixturevalue(f"{request.param}_backbone")


@pytest.fixture(scope="session", params=["masked", "causal"])
def sharp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny masked and a tiny causal model with sharper random weights (see `_sharpen`)."""
    source = request.getfixturevalue(f"{request.param}_dir")
    return _sharpen(source, tmp_path_factory.mktemp(f"sharp-{request.param}"))


# Intent names of one to three corpus words, as an assistant's intents read ("book the movie", "good film").
_INTENT_HEADS = ("book", "answer", "cast", "light", "plot", "wrote", "good", "bad", "great", "awful", "okay")
_INTENT_OBJECTS = (
    "movie",
    "film",
    "book",
    "city",
    "river",
    "light",
    "question",
    "answer",
    "cast",
    "plot",
    "fun",
)


def _intent_names(tokenizer, count: int = 150) -> list[str]:
    """`count` distinct readable intent names whose label words take 1 to 3 tokens on `tokenizer`."""
    names = [f"{head} {obj}" for head in _INTENT_HEADS for obj in _INTENT_OBJECTS if head != obj]
    names += [f"{head} the {obj}" for head in _INTENT_HEADS[:6] for obj in _INTENT_OBJECTS if head != obj]
    names = [*_INTENT_HEADS, *names]
    fitting = [n for n in names if 1 <= len(tokenizer(" " + n, add_special_tokens=False)["input_ids"]) <= 3]
    assert len(fitting) >= count, f"only {len(fitting)} intent names of 1 to 3 tokens"
    return fitting[:count]


@pytest.fixture
def intent_names() -> Callable:
    """`intent_names(tokenizer, count=150)`: a many-label task's label words, each of 1 to 3 tokens."""
    return _intent_names


@dataclass(frozen=True)
class Toy:
    """The sentiment toy set the method tests train on (four sentences, twice over), with its prompt."""

    texts: list[str]
    labels: np.ndarray  # (8,) indices into `verbalizer`
    template: Template
    verbalizer: Verbalizer


def _toy() -> Toy:
    return Toy(
        texts=[
            "the movie was great and fun",
            "a good film with a great cast",
            "it was terrible and boring",
            "a bad film , it was awful",
        ]
        * 2,
        labels=np.array([1, 1, 0, 0] * 2),
        template=Template("{text} It was {mask}"),
        verbalizer=Verbalizer.parse("0=bad,1=good"),
    )


@pytest.fixture
def toy() -> Toy:
    return _toy()


@pytest.fixture
def corpus() -> list[str]:
    """The sentences the tiny models' tokenizers were built from (each three times)."""
    return list(CORPUS)


def _fresh_classifier(directory: Path, spec: str):
    """A classifier for `spec` on a freshly loaded backbone (training mutates it), prepared by its method."""
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.classifier import Classifier
    from openbook.methods import build_method

    backbone = load_backbone(BackboneConfig(name=str(directory), max_length=48))
    method = build_method(spec)
    toy = _toy()
    return method.prepare(Classifier(backbone, toy.template, toy.verbalizer)), method


@pytest.fixture
def fresh_classifier() -> Callable:
    """`fresh_classifier(model_dir, spec) -> (classifier, method)`: the toy prompt on a fresh backbone."""
    return _fresh_classifier


def _save_and_reload(classifier, method, model_dir: Path, tmp_path: Path, config, result, base_sha: str):
    from openbook.backbone import BackboneConfig, load_backbone
    from openbook.checkpoints import load_classifier, save_classifier

    path = save_classifier(
        tmp_path / "ckpt",
        classifier,
        method,
        base_weights_sha256=base_sha,
        train_config=config,
        training_data_sha256="0" * 64,
        dev_metrics={"accuracy": result.best.accuracy},
    )
    return load_classifier(path, backbone=load_backbone(BackboneConfig(name=str(model_dir), max_length=48)))


@pytest.fixture
def save_and_reload() -> Callable:
    """Save a trained classifier as `openbook train` does and load it on a freshly loaded backbone:
    `save_and_reload(classifier, method, model_dir, tmp_path, config, result, base_sha)`."""
    return _save_and_reload


@pytest.fixture
def toy_dataset() -> ToyDatasets:
    return ToyDatasets()


def _install_package(site: Path, distribution: str, files: dict[str, bytes]) -> Path:
    package = distribution.replace("-", "_")
    info = site / f"{package}-1.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0.0\n")
    listed = [f"{package}/data/{name}" for name in files]
    for path, content in zip(listed, files.values(), strict=True):
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in [*listed, f"{info.name}/METADATA"]))
    return site / package / "data"


@pytest.fixture
def install_package() -> Callable[[Path, str, dict[str, bytes]], Path]:
    """`install_package(site, distribution, {name: content})`: `distribution` laid out under `site` as pip
    lays out a package of weights (its files, and a dist-info whose RECORD lists them); the folder holding
    the files. importlib.metadata finds it once `site` is on sys.path (monkeypatch.syspath_prepend)."""
    return _install_package


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The evaluation data, `$OPENBOOK_DATA` (k-shot/ and full/ below it); without it the test is skipped."""
    given = os.environ.get("OPENBOOK_DATA")
    if not given:
        pytest.skip("OPENBOOK_DATA is not set (make test sets it to ../shared/datasets)")
    root = Path(given).resolve()
    if not root.is_dir():
        pytest.skip(f"OPENBOOK_DATA={given} is not a directory")
    return root


@pytest.fixture
def count_tokenized(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Counter[str]]:
    """`count_tokenized(tokenizer)`: a Counter that counts, from then on, each text `tokenizer` is called
    on (stripped: a field is tokenized with the space before it)."""

    def watch(tokenizer: Any) -> Counter[str]:
        seen: Counter[str] = Counter()
        kind = type(tokenizer)
        call = kind.__call__

        def counting(self: Any, text: Any = None, *args: Any, **options: Any) -> Any:
            if self is tokenizer:
                seen.update(t.strip() for t in ([text] if isinstance(text, str) else text))
            return call(self, text, *args, **options)

        monkeypatch.setattr(kind, "__call__", counting)
        return seen

    return watch


@pytest.fixture
def training_flags() -> list[str]:
    """A few tiny training steps, for `openbook train` and for trainable methods in the lab's grids."""
    return [
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--train-batch-size",
        "4",
        "--lr",
        "1e-3",
        "--max-length",
        "48",
    ]
