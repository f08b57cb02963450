"""The torch program that an emitted run dir executes under torchrun.

Modules that import torch (model, parallel, pipeline, train, ...) are only imported by
the workers and by ``autoplan run``; ``config`` and ``support`` are pure Python so that
``autoplan emit`` stays fast and torch-free.
"""
