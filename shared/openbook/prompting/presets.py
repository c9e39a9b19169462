"""Built-in prompts for the standard few-shot benchmarks.

Masked templates and label words follow LM-BFF (Gao et al., 2021, Table 1).
Causal backbones predict the next token, so their templates end at the slot;
where LM-BFF puts the slot first or mid-sentence, the causal variant asks the
same question at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from openbook.prompting.templates import PromptError, Template, Verbalizer


@dataclass(frozen=True)
class Preset:
    name: str
    masked_template: str
    causal_template: str
    labels: str

    def template(self, kind: str) -> Template:
        return Template(self.masked_template if kind == "masked" else self.causal_template)

    @property
    def verbalizer(self) -> Verbalizer:
        return Verbalizer.parse(self.labels)


_SENTIMENT_2 = "0=terrible,1=great"

PRESETS: dict[str, Preset] = {
    p.name.lower(): p
    for p in [
        Preset("SST-2", "{text} It was {mask} .", "{text} It was {mask}", _SENTIMENT_2),
        Preset(
            "sst-5",
            "{text} It was {mask} .",
            "{text} It was {mask}",
            "0=terrible,1=bad,2=okay,3=good,4=great",
        ),
        Preset("mpqa", "{text} It was {mask} .", "{text} It was {mask}", _SENTIMENT_2),
        Preset(
            "trec",
            "{mask} : {text}",
            "Question: {text} The answer is a {mask}",
            "0=Description,1=Entity,2=Expression,3=Human,4=Location,5=Number",
        ),
        Preset(
            "RTE",
            "{text_a} ? {mask} , {text_b}",
            "{text_a} Question: {text_b} True or false? Answer: {mask}",
            "entailment=Yes,not_entailment=No",
        ),
        Preset(
            "QNLI",
            "{text_a} ? {mask} , {text_b}",
            "Question: {text_a} Sentence: {text_b} Does the sentence answer the question? Answer: {mask}",
            "entailment=Yes,not_entailment=No",
        ),
    ]
}


def get_preset(task: str) -> Preset:
    try:
        return PRESETS[task.lower()]
    except KeyError:
        raise PromptError(
            f"no built-in prompt for task {task!r} (presets: {', '.join(p.name for p in PRESETS.values())}); "
            "pass --template and --labels"
        ) from None
