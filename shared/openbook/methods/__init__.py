"""Trainable prompt methods, one module each, registered by name (see `base.py`)."""

from openbook.methods import dart, ipt, l2p, linear_probe, lora, peft_prompts, prompt_ft, retroprompt
from openbook.methods.base import (
    DEFAULT_METHOD,
    METHODS,
    Method,
    MethodConfig,
    MethodError,
    TrainBatch,
    build_method,
    check_prompt_fits,
    method_config,
    recorded_spec,
    register_method,
    weights_sha256,
)

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "Method",
    "MethodConfig",
    "MethodError",
    "TrainBatch",
    "build_method",
    "check_prompt_fits",
    "dart",
    "ipt",
    "l2p",
    "linear_probe",
    "lora",
    "method_config",
    "peft_prompts",
    "prompt_ft",
    "recorded_spec",
    "register_method",
    "retroprompt",
    "weights_sha256",
]
