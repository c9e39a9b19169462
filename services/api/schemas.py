"""Request and response bodies: the HTTP edge, converted to and from domain objects in the routes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from services.bus.task_spec import KnnSettings, Task, TaskCreate

__all__ = ["KnnSettings", "Task", "TaskCreate"]

Text = Annotated[str, StringConstraints(min_length=1)]
TextOrPair = Text | tuple[Text, Text]


class ExampleIn(BaseModel):
    text: TextOrPair
    label: str
    id: int | None = Field(None, ge=0, le=2**63 - 1, description="client-chosen; makes a retry idempotent")


class ExamplesIn(BaseModel):
    examples: list[ExampleIn] = Field(min_length=1)


class ExampleAck(BaseModel):
    id: int
    created: bool  # False: the log already held this example (a retry)


class ExamplesAck(BaseModel):
    examples: list[ExampleAck]
    store_version: str


class Example(BaseModel):
    id: int
    text: TextOrPair
    label: str


class ExamplePage(BaseModel):
    examples: list[Example]
    next_after: int | None  # pass as `after` for the next page; None at the end


class ClassifyIn(BaseModel):
    texts: list[TextOrPair] = Field(min_length=1)
    neighbours: bool = Field(False, description="include the neighbours used, with their texts")


class NeighbourOut(BaseModel):
    id: int
    text: TextOrPair | None
    label: str
    similarity: float


class PredictionOut(BaseModel):
    label: str
    probabilities: dict[str, float]
    p_lm: dict[str, float]
    p_knn: dict[str, float] | None
    neighbours: list[NeighbourOut] | None = None
    truncated: bool


class ClassifyOut(BaseModel):
    predictions: list[PredictionOut]
    model_version: str
    store_version: str


class TrainIn(BaseModel):
    method: str | None = Field(None, description="default: the task's method", examples=["retroprompt"])
    steps: int = Field(32, ge=1, le=100_000)
    batch_size: int = Field(8, ge=1, le=1024)
    lr: float = Field(1e-5, gt=0, lt=1)
    eval_every: int = Field(8, ge=1)
    patience: int = Field(2, ge=1)


class JobOut(BaseModel):
    id: str
    task: str
    method: str
    state: str  # queued, running, succeeded, failed
    progress: float
    train_config: dict
    metrics: dict | None = None
    published: dict | None = None  # the checkpoint: version, path, manifest sha256, log offset
    error: str | None = None


class DemonstrationsIn(BaseModel):
    text: TextOrPair


class DemoNeighbour(BaseModel):
    id: int
    text: TextOrPair | None
    similarity: float
    weight: float  # its share of the class's demonstration vector


class ClassDemonstration(BaseModel):
    label: str
    neighbours: list[DemoNeighbour]  # empty when the store has no example of the class


class DemonstrationsOut(BaseModel):
    demonstrations: list[ClassDemonstration]
    model_version: str
    store_version: str
