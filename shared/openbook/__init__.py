"""OpenBook: retrieval-augmented prompt learning for few-shot text classification.

The core library is pure: tensors, arrays and dataclasses in and out, no HTTP,
no Redis. Services wrap it.
"""

__version__ = "0.1.0"
