"""What one learning-curve run is: the tasks, seeds and rounds, the service task's method and training
settings, the baselines beside it, and how long a round may wait (`run.py` runs it; `setup.py` checks
that a resumed directory was made with the same)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openbook.backbone import BackboneConfig
from openbook.config_fields import default_of
from openbook.encoders import NO_READER
from openbook.methods import DEFAULT_METHOD, build_method
from openbook.models import DEFAULT_BACKBONE
from openbook.prompting import get_preset
from openbook.train_config import TrainConfig

from research.learning_curve.baselines import BASELINES
from research.learning_curve.schedule import ORDERS, ROUNDS, CurveData, check_rounds
from research.learning_curve.service import Waiting


@dataclass(frozen=True)
class CurveSettings:
    data: Path  # the full/ directory
    out: Path
    tasks: Sequence[str]
    seeds: Sequence[int]
    backbone: str = DEFAULT_BACKBONE
    rounds: Sequence[int] = ROUNDS
    orders: Sequence[str] = ORDERS
    baselines: Sequence[str] = BASELINES
    method: str = DEFAULT_METHOD  # the service task's method, which its automatic jobs train
    reader: str | None = None  # the service task's sentence reader (its book's second reader), if any
    test_size: int | None = 500
    pool_size: int | None = 500  # the uncertainty order's pool (the service scores up to 2000)
    # the service task's training settings, its budget spelled out (by default, the default budget), and
    # the weights its jobs keep
    training: dict = field(
        default_factory=lambda: {
            "batch_size": 8,
            "lr": 1e-5,
            "patience": 2,
            "keep": TrainConfig.keep,
            **TrainConfig().budget(),
        }
    )
    max_length: int = BackboneConfig.max_length
    device: str = field(default_factory=lambda: default_of(BackboneConfig, "device"))
    # the worker's first gate against the untrained task (OPENBOOK_UNTRAINED_GATE in the service)
    untrained_gate: bool = False
    judge: int | None = None  # score on this many held-out training examples instead of test (schedule.py)
    # the fixed order's baselines alone, without the service: a baseline added to a curve already recorded
    baselines_only: bool = False
    waiting: Waiting = field(default_factory=Waiting)
    command: str = ""  # as typed, for the record

    def __post_init__(self) -> None:
        check_rounds(self.rounds)
        unknown = [order for order in self.orders if order not in ORDERS]
        if unknown:
            raise ValueError(f"unknown order(s) {unknown}; known: {', '.join(ORDERS)}")
        if self.baselines_only and (list(self.orders) != ["fixed"] or not self.baselines):
            raise ValueError("baselines alone: give baselines and the fixed order alone, which has them")
        TrainConfig(**self.training)  # bad training settings fail before anything starts
        build_method(self.method)  # and so does an unknown method or option (MethodError)

    def task_spec(self, name: str, data: CurveData, kind: str) -> dict:
        """The service task: the task's preset prompt; an automatic job every smallest round."""
        template, verbalizer = get_preset(data.task).prompt(kind)
        return {
            "name": name,
            "template": template.source,
            "labels": dict(zip(verbalizer.labels, verbalizer.words, strict=True)),
            "method": self.method,
            "reader": self.reader or NO_READER,  # named either way: the service's default is not the lab's
            "training": {"auto": True, "every": self.rounds[0] * len(data.labels), **self.training},
        }
