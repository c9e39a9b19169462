"""A task's spec, shared by the api (which creates it) and the trainer (which trains it)."""

from __future__ import annotations

from typing import Annotated

from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.knn import KnnConfig
from openbook.prompting import Template, Verbalizer
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


class TaskCreate(BaseModel):
    name: TaskName
    template: str = Field(examples=["Review: {text}\nSentiment: {mask}"])
    labels: Labels = Field(
        description="label -> label word, in label order", examples=[{"0": "negative", "1": "positive"}]
    )
    backbone: str | None = Field(None, description="default: the service's backbone")
    method: str = "retroprompt"
    knn: KnnSettings = KnnSettings()


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
