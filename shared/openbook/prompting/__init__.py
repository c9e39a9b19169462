"""Cloze prompts: templates with a slot, verbalizers, presets and the token layout."""

from openbook.prompting.encoder import EncodedBatch, PromptEncoder
from openbook.prompting.presets import PRESETS, Preset, get_preset
from openbook.prompting.templates import PromptError, Template, TextInput, Verbalizer
from openbook.prompting.tokens import TokenizedTexts, join_texts

__all__ = [
    "PRESETS",
    "EncodedBatch",
    "Preset",
    "PromptEncoder",
    "PromptError",
    "Template",
    "TextInput",
    "TokenizedTexts",
    "Verbalizer",
    "get_preset",
    "join_texts",
]
