"""Tiny random backbones built from configs and saved/loaded through the real code path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATASETS = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"

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

    wordpiece = BertWordPieceTokenizer()
    wordpiece.train_from_iterator(
        CORPUS, vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
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


@pytest.fixture(scope="session")
def causal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_causal(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def masked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_masked(tmp_path_factory.mktemp("tiny-bert"))


def _load(directory: Path):
    from openbook.backbone import BackboneConfig, load_backbone

    return load_backbone(BackboneConfig(name=str(directory), max_length=48))


@pytest.fixture(scope="session")
def causal_backbone(causal_dir: Path):
    return _load(causal_dir)


@pytest.fixture(scope="session")
def masked_backbone(masked_dir: Path):
    return _load(masked_dir)


@pytest.fixture(scope="session", params=["masked", "causal"])
def backbone(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_backbone")
