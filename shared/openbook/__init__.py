"""OpenBook: retrieval-augmented prompt learning for few-shot text classification.

The core library is pure: tensors, arrays and dataclasses in and out, no HTTP,
no Redis. Services wrap it. The names below are its public API; three calls build, train and save a
classifier as the service does (`estimator.py`):

    clf = openbook.create_classifier("Review: {text}\nSentiment: {mask}", {"0": "negative", "1": "positive"})
    clf.fit(texts, labels)  # label strings
    clf.save("ckpt"); clf = openbook.load("ckpt")

and the parts below them stay public for research: `Classifier`, `build_method`, `train`, ...

The command line is `openbook.cli`; the laboratory (the evaluation grids, reports, benchmarks,
continual learning, the SetFit peer) lives apart from the library, in the checkout's research/.
The names load on first use, so `import openbook.data` (or any module that
needs no model) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openbook.backbone import Backbone, BackboneConfig, load_backbone
    from openbook.checkpoints import load_classifier, save_classifier
    from openbook.classifier import Classifier
    from openbook.demonstrations import DemoConfig
    from openbook.estimator import Estimator, FitReport, create_classifier, load
    from openbook.fitting import LabelledTexts
    from openbook.knn import KnnConfig
    from openbook.labels import LabelError, add_label, fit_to_labels
    from openbook.methods import METHODS, Method, build_method
    from openbook.predictions import Prediction
    from openbook.prompting import Template, Verbalizer
    from openbook.runtime import configure
    from openbook.store import KnowledgeStore
    from openbook.train_config import TrainConfig
    from openbook.training import train
    from openbook.version import __version__

_EXPORTS = {
    "Backbone": "openbook.backbone",
    "BackboneConfig": "openbook.backbone",
    "load_backbone": "openbook.backbone",
    "load_classifier": "openbook.checkpoints",
    "save_classifier": "openbook.checkpoints",
    "Classifier": "openbook.classifier",
    "Prediction": "openbook.predictions",
    "DemoConfig": "openbook.demonstrations",
    "Estimator": "openbook.estimator",
    "FitReport": "openbook.estimator",
    "create_classifier": "openbook.estimator",
    "load": "openbook.estimator",
    "LabelledTexts": "openbook.fitting",
    "KnnConfig": "openbook.knn",
    "LabelError": "openbook.labels",
    "add_label": "openbook.labels",
    "fit_to_labels": "openbook.labels",
    "METHODS": "openbook.methods",
    "Method": "openbook.methods",
    "build_method": "openbook.methods",
    "Template": "openbook.prompting",
    "Verbalizer": "openbook.prompting",
    "configure": "openbook.runtime",
    "KnowledgeStore": "openbook.store",
    "TrainConfig": "openbook.train_config",
    "train": "openbook.training",
    "__version__": "openbook.version",
}
__all__ = [
    "METHODS",
    "Backbone",
    "BackboneConfig",
    "Classifier",
    "DemoConfig",
    "Estimator",
    "FitReport",
    "KnnConfig",
    "KnowledgeStore",
    "LabelError",
    "LabelledTexts",
    "Method",
    "Prediction",
    "Template",
    "TrainConfig",
    "Verbalizer",
    "__version__",
    "add_label",
    "build_method",
    "configure",
    "create_classifier",
    "fit_to_labels",
    "load",
    "load_backbone",
    "load_classifier",
    "save_classifier",
    "train",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'openbook' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
