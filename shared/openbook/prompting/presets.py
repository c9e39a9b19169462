"""Built-in prompts for the standard few-shot benchmarks.

Masked templates and label words follow LM-BFF (Gao et al., 2021, Table 1).
Causal backbones predict the next token, so their templates end at the slot;
where LM-BFF puts the slot first or mid-sentence, the causal variant asks the
same question at the end.

A preset's label words belong to its template, so a preset may carry separate
causal labels. The SST-2 causal prompt was chosen on the dev sets only (5 seeds
x 32 sentences, domain calibration, smollm2-135m): `Review: {text}\nSentiment:
{mask}` with negative/positive scored 79.4% dev accuracy against 63.7% for the
LM-BFF prompt `{text} It was {mask}` with terrible/great; for mpqa,
`Text: {text}\nSentiment: {mask}` scored 80.6% against 67.5%; for sst-5,
`Review: {text}\nSentiment: {mask}` scored 37.7% against 32.8%. The candidates
and their dev scores are listed in docs/prompt-selection.md.

A task of many labels names them in its data (`labels_file`, read from the
task's folder): clinc150's 150 intent names, each its own label word, under the
template of the intent-detection setting (`Customer message: {text}` then
`Intent:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from openbook.prompting.templates import PromptError, Template, Verbalizer


@dataclass(frozen=True)
class Preset:
    name: str
    masked_template: str
    causal_template: str
    labels: str
    causal_labels: str | None = None  # label words for the causal template, when they differ
    labels_file: str | None = None  # or the task's own `id=word` lines, in this file of its data folder

    def template(self, kind: str) -> Template:
        return Template(self.masked_template if kind == "masked" else self.causal_template)

    def verbalizer(self, kind: str, task_dir: Path | None = None) -> Verbalizer:
        if self.labels_file is not None:
            if task_dir is None:
                raise PromptError(f"task {self.name!r} reads its labels from its data: give --data")
            return read_labels_file(task_dir / self.labels_file)
        return Verbalizer.parse(
            self.causal_labels if kind == "causal" and self.causal_labels else self.labels
        )

    def prompt(self, kind: str, task_dir: Path | None = None) -> tuple[Template, Verbalizer]:
        return self.template(kind), self.verbalizer(kind, task_dir)


def read_labels_file(path: Path) -> Verbalizer:
    """`id=word` lines (blank lines skipped), in file order: a task's labels as its data names them."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as error:
        raise PromptError(f"cannot read the task's labels: {error}") from None
    pairs = [line.partition("=") for line in lines]
    bad = [line for line, (label, _, word) in zip(lines, pairs, strict=True) if not (label and word)]
    if bad or not pairs:
        raise PromptError(f"{path}: expected one `id=word` per line, got {bad[0] if bad else 'none'!r}")
    return Verbalizer(tuple(p[0].strip() for p in pairs), tuple(p[2].strip() for p in pairs))


_SENTIMENT_2 = "0=terrible,1=great"

PRESETS: dict[str, Preset] = {
    p.name.lower(): p
    for p in [
        Preset(
            "SST-2",
            "{text} It was {mask} .",
            "Review: {text}\nSentiment: {mask}",
            _SENTIMENT_2,
            causal_labels="0=negative,1=positive",
        ),
        Preset(
            "sst-5",
            "{text} It was {mask} .",
            "Review: {text}\nSentiment: {mask}",
            "0=terrible,1=bad,2=okay,3=good,4=great",
        ),
        Preset(
            "mpqa",
            "{text} It was {mask} .",
            "Text: {text}\nSentiment: {mask}",
            _SENTIMENT_2,
            causal_labels="0=negative,1=positive",
        ),
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
        Preset(
            "clinc150",
            "Customer message: {text} Intent: {mask} .",
            "Customer message: {text}\nIntent: {mask}",
            "",
            labels_file="labels.txt",
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
