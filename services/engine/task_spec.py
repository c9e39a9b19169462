"""A task's spec, shared by the api (which creates it) and the trainer (which trains it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Self

from annotated_types import GroupedMetadata
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.encoders import DEFAULT_READER, DEFAULT_READER_ENV, NO_READER, chosen_reader
from openbook.knn import KnnConfig
from openbook.label_names import words_for_names
from openbook.methods import DEFAULT_METHOD, build_method
from openbook.sentence_reader import SentenceReader, untuned_reader
from openbook.train_config import TrainConfig
from openbook.untrained import UNTRAINED_KNN, build_classifier
from openbook.word_scores import VECTORS_ABOVE, LabelScoringChoice
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from services.bus.keys import TASK_NAME_PATTERN
from services.engine.config_models import mirrored_fields, model_of

SERVING = ("min_confidence", "refuse_out_of_scope")  # how a task serves: changed in place (PATCH)
BUDGET_KEYS = {"steps", "epochs"}  # a training run's length, given one way or the other
BOUNDS = {"max_steps", "min_steps"}  # the budget's cap and (under epochs) its floor

TaskName = Annotated[str, StringConstraints(pattern=TASK_NAME_PATTERN)]
# Text with something in it besides whitespace. The class spells out what str.strip() removes, so that
# pydantic, JSON Schema and Python's re agree on it (their \s differ).
NOT_ONLY_WHITESPACE = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
NonBlank = Annotated[str, StringConstraints(min_length=1, pattern=NOT_ONLY_WHITESPACE)]
_NON_BLANK_SCHEMA = {"type": "string", "minLength": 1, "pattern": NOT_ONLY_WHITESPACE}
# The most labels a task may have. A label costs a word in every prompt's verbalizer and a row in every
# prediction's probabilities (a response of 1,000 labels' probabilities is about 30 kB a text); real intent
# sets have 50 to 150.
MAX_LABELS = 1000


def _words_of_names(labels: object, min_labels: int) -> object:
    """A list of label names becomes label -> readable word (openbook.label_names); anything else is left
    for the object's own validation."""
    if not isinstance(labels, list):
        return labels
    if not min_labels <= len(labels) <= MAX_LABELS:
        raise ValueError(f"{len(labels)} label name(s): give {min_labels} to {MAX_LABELS}")
    if not all(isinstance(name, str) for name in labels):
        raise ValueError("label names must be strings")
    return words_for_names(labels)  # LabelNameError, a ValueError: the request's 422


@dataclass(frozen=True)
class LabelSet(GroupedMetadata):
    """Label -> label word, in label order, `min_labels` to MAX_LABELS of them; given, also a list of
    label names (`_words_of_names`). Stored and returned as the object."""

    min_labels: int
    description: str

    def __iter__(self) -> Iterator[object]:  # the constraints pydantic applies, and the schema it shows
        as_object = {
            "type": "object",
            "minProperties": self.min_labels,
            "maxProperties": MAX_LABELS,
            # pydantic would describe the keys' pattern as patternProperties, which leaves other keys
            # unconstrained: hence the schema spelled out
            "propertyNames": _NON_BLANK_SCHEMA,
            "additionalProperties": _NON_BLANK_SCHEMA,
        }
        as_names = {
            "type": "array",
            "minItems": self.min_labels,
            "maxItems": MAX_LABELS,
            "uniqueItems": True,
            "items": _NON_BLANK_SCHEMA,
            "description": "label names alone, each scored by its readable word: book_flight -> book "
            "flight, transferMoney -> transfer money (two names may not make one word)",
        }
        yield Field(min_length=self.min_labels, max_length=MAX_LABELS)
        yield BeforeValidator(lambda labels: _words_of_names(labels, self.min_labels))
        described = {"description": self.description}
        yield WithJsonSchema({"anyOf": [as_object, as_names], **described}, mode="validation")
        yield WithJsonSchema(
            {**as_object, "description": "label -> label word, in label order"}, mode="serialization"
        )


Labels = Annotated[
    dict[NonBlank, NonBlank],
    LabelSet(
        2,
        "label -> label word, in label order; or a list of label names, each scored by its readable "
        f"word (book_flight -> book flight); 2 to {MAX_LABELS} labels",
    ),
]
NewLabels = Annotated[
    dict[NonBlank, NonBlank],
    LabelSet(1, "labels to add, all or none: label -> label word, or a list of label names"),
]


# A threshold on the best label's probability, 0 to 1, or None for none. Strict: a JSON number, not true
# nor "0.5"; and not finite is not valid, as for the kNN settings (JSON would store it as null).
MinConfidence = Annotated[float | None, Field(ge=0, le=1, allow_inf_nan=False, strict=True)]


class _Numbers(BaseModel):
    """Settings whose numbers are JSON numbers: pydantic would read a boolean as 1 or 0 where the schema
    asks for an integer (an integer-valued 16.0 stays one, as JSON Schema counts it)."""

    @field_validator("*", mode="before")
    @classmethod
    def _a_boolean_is_no_number(cls, value: Any, info: ValidationInfo) -> Any:
        if (
            isinstance(value, bool)
            and info.field_name
            and cls.model_fields[info.field_name].annotation is not bool
        ):
            raise ValueError("a boolean is not a number")
        return value


# A task's kNN settings are the library's for an untrained classifier (openbook.untrained), which
# `openbook classify` and `openbook.create_classifier` share: their types, defaults and help read from
# there, but for lambda's. Not finite is not valid: JSON would store infinity as null, a spec that no
# longer reads back.
_KnnFields = model_of(
    "_KnnFields",
    {
        **mirrored_fields(
            UNTRAINED_KNN,
            {"k": {"ge": 1, "le": 1024}, "temperature": {"gt": 0, "allow_inf_nan": False}},
        ),
        "lam": (
            float | None,
            Field(
                None,
                ge=0,
                le=1,
                allow_inf_nan=False,
                description="the weight of P_kNN while the task is untrained; null: chosen on the task's own "
                "examples, each scored leave-one-out (a training job chooses it on dev)",
            ),
        ),
        **mirrored_fields(UNTRAINED_KNN, {"similarity": {}}),
    },
    base=_Numbers,
)


class KnnSettings(_KnnFields):  # type: ignore[misc, valid-type]  # a model made above
    """A task's kNN settings."""


class _Method(_Numbers):
    method: str | None = Field(None, description="default: the task's method", examples=[DEFAULT_METHOD])


# The TrainConfig fields a job may set, under the bounds the api puts on them; their types,
# defaults and help are TrainConfig's, which `openbook.create_classifier(...).fit` and `openbook train`
# read too. The
# budget: `steps`, or `epochs` (passes over the task's training examples at the time of the job), or
# neither for the default budget; `max_steps` caps either.
_TrainKnobs = model_of(
    "_TrainKnobs",
    mirrored_fields(
        TrainConfig,
        {
            "steps": {"ge": 1, "le": 100_000},
            "epochs": {"gt": 0, "le": 1_000, "allow_inf_nan": False},
            "max_steps": {"ge": 1, "le": 100_000},
            "min_steps": {"ge": 1, "le": 100_000},
            "batch_size": {"ge": 1, "le": 1024},
            "lr": {"gt": 0, "lt": 1, "allow_inf_nan": False},
            "eval_every": {"ge": 1},
            "patience": {"ge": 1},
            "precision": {},
            "keep": {},
            "few_dev_lam": {"ge": 0, "le": 1, "allow_inf_nan": False},
        },
    ),
    base=_Method,
)


class TrainOptions(_TrainKnobs):  # type: ignore[misc, valid-type]  # a model made above
    """What a training job is asked for: the method, and the knobs of its loop (train_config.TrainConfig)."""

    # One budget at most, and a floor only under epochs, said in the schema too, so that a client (or a
    # fuzzer) can know it.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["steps", "epochs"],
                "properties": {"steps": {"type": "integer"}, "epochs": {"type": "number"}},
            },
            "if": {"required": ["min_steps"], "properties": {"min_steps": {"type": "integer"}}},
            "then": {"required": ["epochs"], "properties": {"epochs": {"type": "number"}}},
        }
    )

    @model_validator(mode="after")
    def _one_budget(self) -> Self:
        # both budgets at once, or a floor without epochs: its ValueError, a 422
        TrainConfig(steps=self.steps, epochs=self.epochs, min_steps=self.min_steps)
        return self

    def train_config(self) -> dict[str, Any]:
        """The knobs, as a job's `train_config` (TrainConfig's keyword arguments).

        The budget is written as it runs (`TrainConfig.budget`): the defaults of the budget given, or of
        the default one, spelled out, the other budget left out.
        """
        budget = TrainConfig(
            steps=self.steps,
            epochs=self.epochs,
            max_steps=self.max_steps,
            min_steps=self.min_steps,
            eval_every=self.eval_every,
        ).budget()
        knobs = self.model_dump(
            include=set(TrainOptions.model_fields) - {"method", *BUDGET_KEYS, *BOUNDS, "eval_every"},
            exclude_none=True,
        )
        if knobs["precision"] == TrainConfig.precision:  # written only when used
            del knobs["precision"]  # (`keep` always: jobs from before "last" was the default kept the best)
        return knobs | budget

    def merged(self, changes: dict[str, Any]) -> Self:
        """These settings with `changes` over them; `steps`, `epochs`, the cap `max_steps` and the floor
        `min_steps` are one setting, the budget, so a change that gives `steps` or `epochs` replaces all."""
        budget = BUDGET_KEYS | BOUNDS
        kept = self.model_dump(exclude=budget if BUDGET_KEYS & changes.keys() else set())
        return self.model_validate({**kept, **changes})


class BadTraining(ValueError):
    """Training options that cannot train a task; `field` is the option at fault ("" for their mix)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_training(options: TrainOptions, task_method: str, backbone: Backbone) -> str:
    """The method `options` train with, once it and the knobs are checked on `backbone` (BadTraining)."""
    method = options.method or task_method
    try:
        build_method(method).check_backbone(backbone)
    except ValueError as error:  # an unknown method, or one this backbone cannot carry
        raise BadTraining("method", str(error)) from None
    try:
        TrainConfig(**options.train_config())
    except ValueError as error:
        raise BadTraining("", str(error)) from None
    return method


class TrainingSettings(TrainOptions):
    """Whether a task trains by itself, and how (services.engine.autotrain)."""

    # strict: a JSON boolean only, as the schema says (pydantic would take 0, 1 or "yes" as well)
    # On: a task trains by itself, and the promotion gate keeps a version worse than the one it would
    # replace, the untrained task included, from serving (services.trainer.gate).
    auto: bool = Field(True, strict=True, description="queue a training job by itself as examples are added")
    every: int = Field(16, ge=1, description="examples added between two automatic jobs")


class TaskCreate(BaseModel):
    name: TaskName
    template: str = Field(examples=["Review: {text}\nSentiment: {mask}"])
    labels: Labels = Field(
        examples=[{"0": "negative", "1": "positive"}, ["book_flight", "transfer", "what_is_your_name"]]
    )
    backbone: str | None = Field(None, description="default: the service's backbone")
    method: str = DEFAULT_METHOD
    label_scoring: LabelScoringChoice = Field(
        "auto",
        description="exact: log P(word | prompt) over every token of a multi-token label word; vectors:"
        " each label's vector in the slot's space (the mean of its word's output rows), one product for all"
        f" labels, far cheaper with many labels of long words on a causal backbone; auto: exact up to"
        f" {VECTORS_ABOVE} labels, vectors above (as the task's labels stand when its classifier is built)",
    )
    reader: str | None = Field(
        None,
        description="the sentence encoder that keys the book: P_kNN reads the examples' neighbours in its"
        " space and a training job tunes it on them (mpnet: all-mpnet-base-v2); null: the service's default"
        f' reader ({DEFAULT_READER_ENV}, else {DEFAULT_READER}); "{NO_READER}": none, the prompt\'s slot'
        " vectors key the book",
        examples=["mpnet", NO_READER],
    )
    knn: KnnSettings = KnnSettings()
    training: TrainingSettings = TrainingSettings()
    min_confidence: MinConfidence = Field(
        None,
        description="classify abstains (label null) below this probability of its best label; null: never",
    )
    refuse_out_of_scope: StrictBool = Field(
        False,
        description="classify refuses (label null) a query its version's job found out of scope: its nearest"
        " stored example, in the reader's space, less similar than the threshold the job chose on dev (at"
        " most 3 points of dev accuracy lost); every prediction says `out_of_scope` either way",
    )

    def as_task(self, default_backbone: str, default_reader: str) -> Task:
        """The task this spec creates: the service's backbone and reader where it names none."""
        return Task(
            **{
                **self.model_dump(),
                "backbone": self.backbone or default_backbone,
                "reader": chosen_reader(self.reader, default_reader),
            }
        )


class Task(TaskCreate):
    labels: Labels = Field(examples=[{"0": "negative", "1": "positive"}])  # as stored: label -> word
    backbone: str
    reader: str | None = Field(
        None, description="the sentence encoder that keys the book; null: none, the slot vectors key it"
    )

    @field_validator("reader")
    @classmethod
    def _none_names_no_reader(cls, value: str | None) -> str | None:
        return None if value == NO_READER else value  # as `TaskCreate.as_task` resolves it


def task_classifier(task: Task, backbone: Backbone) -> Classifier:
    """The untrained classifier a task starts from (`untrained.build_classifier`), with its sentence
    reader where it names one; bad templates or label words raise PromptError."""
    knn = KnnConfig(
        task.knn.k,
        task.knn.temperature,
        UNTRAINED_KNN.lam if task.knn.lam is None else task.knn.lam,  # None: TaskRuntime chooses it
        task.knn.similarity,
    )
    return build_classifier(
        backbone,
        task.template,
        task.labels,
        knn=knn,
        label_scoring=task.label_scoring,
        reader=task_reader(task, str(backbone.device)),
    )


def task_reader(task: Task, device: str) -> SentenceReader | None:
    """The task's untuned sentence reader on the process's shared base of its encoder, or None."""
    return None if task.reader is None else untuned_reader(task.reader, device)
