"""PyTorch + Hugging Face transformers, a reference engine: ``setup`` (parent side), ``engine`` (child side), ``logparse`` (its log).

See :mod:`harness.engines` for what an engine package holds."""
