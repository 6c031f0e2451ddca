"""vLLM (its offline ``LLM`` in the harness's child process): ``setup`` (parent side), ``options`` (both sides),
``engine`` and ``child`` (child side; only ``child`` imports vLLM), ``logparse`` (its log).

See :mod:`harness.engines` for what an engine package holds."""
