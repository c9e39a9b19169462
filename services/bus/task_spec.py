"""A task's spec, shared by the api (which creates it) and the trainer (which trains it)."""

from __future__ import annotations

from typing import Annotated

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.methods import build_method
from openbook.prompting import Template, Verbalizer
from openbook.training import TrainConfig
from pydantic import BaseModel, Field, StringConstraints, WithJsonSchema

TASKS_KEY = "openbook:tasks"  # hash: task name -> spec JSON
# hash: task name -> how many times a task of that name was deleted. Never deleted itself, so a job or
# checkpoint made for an earlier task of the same name can be told from one of the task that exists now.
GENERATIONS_KEY = "openbook:task-generations"
TASK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # also what makes a name safe as a directory name

TaskName = Annotated[str, StringConstraints(pattern=TASK_NAME_PATTERN)]
# Text with something in it besides whitespace. The class spells out what str.strip() removes, so that
# pydantic, JSON Schema and Python's re agree on it (their \s differ).
NOT_ONLY_WHITESPACE = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
NonBlank = Annotated[str, StringConstraints(min_length=1, pattern=NOT_ONLY_WHITESPACE)]
_NON_BLANK_SCHEMA = {"type": "string", "minLength": 1, "pattern": NOT_ONLY_WHITESPACE}
# pydantic would describe the keys' pattern as patternProperties, which leaves other keys unconstrained
Labels = Annotated[
    dict[NonBlank, NonBlank],
    Field(min_length=2),
    WithJsonSchema(
        {
            "type": "object",
            "minProperties": 2,
            "propertyNames": _NON_BLANK_SCHEMA,
            "additionalProperties": _NON_BLANK_SCHEMA,
        }
    ),
]


class KnnSettings(BaseModel):
    k: int = Field(16, ge=1, le=1024)
    # Not finite is not valid: JSON would store infinity as null, a spec that no longer reads back.
    temperature: float = Field(0.1, gt=0, allow_inf_nan=False)
    lam: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)


class TrainOptions(BaseModel):
    """What a training job is asked for: the method, and the knobs of its loop (training.TrainConfig)."""

    method: str | None = Field(None, description="default: the task's method", examples=["retroprompt"])
    steps: int = Field(32, ge=1, le=100_000)
    batch_size: int = Field(8, ge=1, le=1024)
    lr: float = Field(1e-5, gt=0, lt=1, allow_inf_nan=False)
    eval_every: int = Field(8, ge=1)
    patience: int = Field(2, ge=1)

    def train_config(self) -> dict[str, int | float]:
        """The knobs, as a job's `train_config` (TrainConfig's keyword arguments)."""
        return self.model_dump(include=set(TrainOptions.model_fields) - {"method"})


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
    """Whether a task trains by itself, and how (services.bus.autotrain)."""

    # strict: a JSON boolean only, as the schema says (pydantic would take 0, 1 or "yes" as well)
    auto: bool = Field(False, strict=True, description="queue a training job by itself as examples are added")
    every: int = Field(16, ge=1, description="examples added between two automatic jobs")


class TaskCreate(BaseModel):
    name: TaskName
    template: str = Field(examples=["Review: {text}\nSentiment: {mask}"])
    labels: Labels = Field(
        description="label -> label word, in label order", examples=[{"0": "negative", "1": "positive"}]
    )
    backbone: str | None = Field(None, description="default: the service's backbone")
    method: str = "retroprompt"
    knn: KnnSettings = KnnSettings()
    training: TrainingSettings = TrainingSettings()


class Task(TaskCreate):
    backbone: str


def build_classifier(task: Task, backbone: Backbone) -> Classifier:
    """The untrained classifier a task starts from; bad templates or label words raise PromptError."""
    verbalizer = Verbalizer(tuple(task.labels), tuple(task.labels.values()))
    classifier = Classifier(
        backbone,
        Template(task.template),
        verbalizer,
        knn=KnnConfig(task.knn.k, task.knn.temperature, task.knn.lam),
    )
    classifier.label_bias = classifier.calibration_bias("content-free")  # no data yet: calibrate on "N/A"
    return classifier
