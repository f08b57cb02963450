"""autoplan: search, simulate, emit and verify parallel training plans for transformers."""

__version__ = "0.1.0"
