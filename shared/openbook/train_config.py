"""What a training run is given: its budget, its knobs and what it keeps (`TrainConfig`).

The run's budget is one of two kinds; the warmup and decay span it.

- An epoch budget (`epochs`): passes over the training set, an epoch being
  ceil(N / batch_size) steps (the last batch of a pass may be short), so
  ceil(epochs * ceil(N / batch_size)) steps, which grows with the task: 16
  shots per class are 32 examples on SST-2 but 96 on trec. Dev is checked at
  the end of every epoch unless `eval_every` says otherwise, so `patience`
  counts epochs without a better dev score. `min_steps`, when given, is a
  floor (a small training set still gets that many steps), and the steps are
  capped at `max_steps` (DEFAULT_MAX_STEPS when not given), so a large task
  cannot run for hours.
- A step budget (`steps`): that many optimiser steps whatever the task, a dev
  check every `eval_every` steps (DEFAULT_EVAL_EVERY when not given), so
  `patience` counts checks and a run stops after `patience * eval_every`
  steps without a better dev score. `max_steps`, when given, caps it too.

Given neither, a run gets the default budget, an epoch budget chosen on dev
(docs/experiments/budget-floor-fresh-splits.md, "A floor of epochs, on fresh splits"): DEFAULT_EPOCHS
epochs, at least DEFAULT_MIN_STEPS and at most DEFAULT_MAX_STEPS steps, a dev
check every DEFAULT_EVAL_EVERY steps. 16 shots per class are 32 steps on
SST-2 and 96 on trec.

The default budget also makes one whole pass over the training set
(`first_pass`): its cap never cuts the first epoch, and its dev checks are at
least ceil(steps_per_epoch / patience) steps apart, so early stopping cannot
end a run before every example has been seen once. Up to 128 training
examples (16 shots of 8 classes: an epoch of at most 16 steps at batch 8)
neither binds, so such a run is what it was; the cap binds only above 960.
On large sets they do: 150 intents of 10 examples (1,500, an epoch of 188
steps) get 188 steps with dev checked at steps 94 and 188, where the plain
cap would have stopped at step 120 with 540 examples unseen, and checks every
8 steps would have let two checks without gain stop the run at step 16.
Spacing the checks also bounds their cost: a check scores every dev example
(a third as many as the training examples in the service), twice with
demonstrations, so a check every 8 steps would cost more than the steps.

Whatever the budget, the last step is always checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from openbook.calibration import CalibrationMode
from openbook.devices import Precision

# The default budget, when neither `steps` nor `epochs` is given
# (docs/experiments/budget-floor-fresh-splits.md, "A floor of epochs, on fresh splits"): 8 epochs, at least
# 32 steps, a dev check every DEFAULT_EVAL_EVERY steps.
DEFAULT_EPOCHS = 8.0
DEFAULT_MIN_STEPS = 32
DEFAULT_EVAL_EVERY = 8  # steps between dev checks, unless `eval_every` is given or `epochs` is (every epoch)
# The cap of an epoch budget, when `max_steps` is not given: an automatic job at 16 examples per class
# ends within 10 minutes on a 2-core CPU (docs/experiments/training-budget-and-backbone.md, "The training
# budget, chosen on dev").
DEFAULT_MAX_STEPS = 120

# The weights a run ends with: "last", its budget run out, dev scored at the start and the end alone; or
# "best", the best dev check's, stopping after `patience` without gain. "last" is the default: a few dozen
# dev examples choose the step by noise (docs/decisions.md, "The kept weights in the service's jobs").
Keep = Literal["best", "last"]

# Fewer dev examples per label than this, and a job whose `few_dev_lam` is set takes that λ rather than
# choosing it on dev (docs/experiments/two-readers.md, "Probe 9"): on a handful of examples every λ ties on
# accuracy and one example's likelihood decides.
FEW_DEV_PER_LABEL = 2


@dataclass(frozen=True)
class TrainConfig:
    """A training run's budget and knobs; the defaults of every door (`Estimator.fit`, `openbook train`'s
    flags, a service job's `training`), which read them and their help from here (`config_fields.py`)."""

    steps: int | None = field(
        default=None,
        metadata={
            "help": "optimiser steps, whatever the training set; neither steps nor epochs: the default "
            f"budget, {DEFAULT_EPOCHS:g} epochs of at least {DEFAULT_MIN_STEPS} and at most "
            f"{DEFAULT_MAX_STEPS} steps, a dev check every {DEFAULT_EVAL_EVERY} steps; on a large set at "
            "least one epoch, its dev checks at least an epoch / patience apart, so every example is seen "
            "once"
        },
    )
    epochs: float | None = field(
        default=None,
        metadata={
            "help": "passes over the training set instead of steps: an epoch is ceil(N / batch size) steps"
        },
    )
    max_steps: int | None = field(
        default=None,
        metadata={
            "help": f"the most optimiser steps, whatever the budget; none: {DEFAULT_MAX_STEPS} with epochs, "
            "no cap with steps"
        },
    )
    min_steps: int | None = field(
        default=None,
        metadata={"help": "with epochs: at least this many optimiser steps, however small the training set"},
    )
    first_pass: bool | None = field(
        default=None,
        metadata={
            "help": "an epoch budget's run sees every example once: its cap is at least an epoch, its dev "
            "checks at least ceil(steps per epoch / patience) steps apart; none: for the default budget only"
        },
    )
    batch_size: int = field(default=8, metadata={"help": "training examples per optimiser step"})
    lr: float = field(default=1e-5, metadata={"help": "AdamW's peak learning rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW's weight decay"})
    warmup_ratio: float = field(
        default=0.1, metadata={"help": "share of the steps the learning rate warms up"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradients clipped to this norm"})
    eval_every: int | None = field(
        default=None,
        metadata={
            "help": f"steps between dev checks; none: every epoch with epochs, else {DEFAULT_EVAL_EVERY}"
        },
    )
    patience: int = field(
        default=2,
        metadata={
            "help": "dev checks without a better dev score before stopping (epochs, with epochs' checks)"
        },
    )
    reembed_every: int | None = field(
        default=None, metadata={"help": "steps between store re-embeddings; none: once per epoch"}
    )
    calibration: CalibrationMode = field(
        default="domain", metadata={"help": "P_LM's label prior: measured on the training texts, or none"}
    )
    seed: int = field(default=13, metadata={"help": "the shuffling's and the initial weights' seed"})
    precision: Precision = field(
        default="float32",
        metadata={
            "help": "float32, or bfloat16: mixed precision (autocast; the weights and optimiser state stay "
            "float32), faster where the device multiplies bfloat16 natively"
        },
    )
    keep: Keep = field(
        default="last",
        metadata={
            "help": "last: run the budget and keep the last weights (dev scored at the start and the end "
            "only); best: dev checks keep the best weights and stop early"
        },
    )

    few_dev_lam: float | None = field(
        default=None,
        metadata={
            "help": f"lambda where dev holds fewer than {FEW_DEV_PER_LABEL} examples per label, set rather "
            "than chosen on them (0 to 1); none: chosen on dev however few"
        },
    )

    def __post_init__(self) -> None:
        if self.steps is not None and self.epochs is not None:
            raise ValueError(
                f"give the budget as steps or as epochs, not both (steps={self.steps}, epochs={self.epochs})"
            )
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ValueError(f"epochs must be a positive number, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.min_steps is not None and (self.epochs is None or self.min_steps < 1):
            raise ValueError(f"min_steps is a positive floor of an epoch budget, got {self.min_steps}")
        if self.first_pass and self.steps is not None:
            raise ValueError("first_pass belongs to an epoch budget: a step budget runs its steps")
        if min(self.batch_size, self.patience, 1 if self.eval_every is None else self.eval_every) < 1:
            raise ValueError("batch_size, eval_every and patience must be at least 1")
        if self.lr <= 0 or not 0 <= self.warmup_ratio < 1:
            raise ValueError("lr must be positive and warmup_ratio in [0, 1)")
        if self.reembed_every is not None and self.reembed_every < 1:
            raise ValueError("reembed_every must be at least 1")
        if self.calibration == "content-free":
            raise ValueError("training calibrates on the training texts: use 'domain' or 'none'")
        if self.precision not in get_args(Precision):
            choices = ", ".join(get_args(Precision))
            raise ValueError(f"precision must be one of {choices}, got {self.precision!r}")
        if self.few_dev_lam is not None and not 0 <= self.few_dev_lam <= 1:
            raise ValueError(f"few_dev_lam must be in [0, 1], got {self.few_dev_lam}")
        if self.keep not in get_args(Keep):
            raise ValueError(f"keep must be one of {', '.join(get_args(Keep))}, got {self.keep!r}")

    def steps_per_epoch(self, num_train: int) -> int:
        """Steps of one pass over `num_train` examples; the last batch may be short."""
        return -(-num_train // self.batch_size)

    def total_steps(self, num_train: int) -> int:
        """The run's budget in optimiser steps, for a training set of `num_train` examples."""
        if self.steps is not None:
            return self.steps if self.max_steps is None else min(self.steps, self.max_steps)
        epochs, floor = self._epochs()
        epoch = self.steps_per_epoch(num_train)
        # rounded first, so that float noise (0.1 * 30 = 3.0000000000000004) does not add a step
        planned = max(math.ceil(round(epochs * epoch, 9)), floor or 1)
        cap = self.max_steps or DEFAULT_MAX_STEPS
        return max(1, min(planned, max(cap, epoch) if self.makes_first_pass() else cap))

    def check_every(self, num_train: int) -> int:
        """Steps between two dev checks, for a training set of `num_train` examples."""
        if self.eval_every is not None:
            every = self.eval_every
        else:
            every = self.steps_per_epoch(num_train) if self.epochs is not None else DEFAULT_EVAL_EVERY
        if self.makes_first_pass():  # `patience` checks without gain span at least an epoch
            return max(every, -(-self.steps_per_epoch(num_train) // self.patience))
        return every

    def makes_first_pass(self) -> bool:
        """Whether the run sees every example once before its cap or early stopping ends it."""
        return (
            self.first_pass if self.first_pass is not None else (self.steps is None and self.epochs is None)
        )

    def budget(self) -> dict[str, int | float | bool]:
        """The budget's settings as they run, with the defaults that do not depend on the data spelled
        out: `steps` and `eval_every` (and `max_steps` only when given), or `epochs`, `max_steps` and
        `min_steps` when there is one (and `eval_every` when given or by default; else a dev check every
        epoch; and `first_pass` when it holds). The default budget reads as the epoch budget it is."""
        if self.steps is not None:
            every = self.eval_every or DEFAULT_EVAL_EVERY
            spelled: dict[str, int | float | bool] = {"steps": self.steps, "eval_every": every}
            return spelled if self.max_steps is None else spelled | {"max_steps": self.max_steps}
        epochs, floor = self._epochs()
        spelled = {"epochs": epochs, "max_steps": self.max_steps or DEFAULT_MAX_STEPS}
        if floor is not None:
            spelled["min_steps"] = floor
        if self.makes_first_pass():
            spelled["first_pass"] = True
        eval_every = self.eval_every or (None if self.epochs is not None else DEFAULT_EVAL_EVERY)
        return spelled if eval_every is None else spelled | {"eval_every": eval_every}

    def _epochs(self) -> tuple[float, int | None]:
        """An epoch budget's epochs and floor: those given, or the default budget's."""
        if self.epochs is not None:
            return self.epochs, self.min_steps
        return DEFAULT_EPOCHS, DEFAULT_MIN_STEPS
