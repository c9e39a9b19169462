"""Tiny random backbones built from configs and saved/loaded through the real code path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from openbook.prompting import Template, Verbalizer

SHARED_DATASETS = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"

# The sentiment toy set the method tests train on (four sentences, twice over), with its prompt.
TEXTS = [
    "the movie was great and fun",
    "a good film with a great cast",
    "it was terrible and boring",
    "a bad film , it was awful",
] * 2
LABELS = np.array([1, 1, 0, 0] * 2)
TEMPLATE, VERBALIZER = Template("{text} It was {mask}"), Verbalizer.parse("0=bad,1=good")

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


def _save_causal(directory: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=1, special_tokens=["<pad>", "<s>", "</s>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
    )
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


@pytest.fixture(scope="session", params=["masked", "causal"])
def backbone(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_backbone")


@pytest.fixture(scope="session", params=["masked", "causal"])
def sharp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny masked and a tiny causal model with sharper random weights (see `_sharpen`)."""
    source = request.getfixturevalue(f"{request.param}_dir")
    return _sharpen(source, tmp_path_factory.mktemp(f"sharp-{request.param}"))


def save_and_reload(classifier, method, model_dir: Path, tmp_path: Path, config, result, base_sha: str):
    """Save a trained classifier as `openbook train` does and load it on a freshly loaded backbone."""
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
