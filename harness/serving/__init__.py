"""Serving under load: an engine's OpenAI-compatible server measured at fixed concurrency levels and Poisson request
rates (``benchcal bench --serve``).

:mod:`harness.serving.config` checks a run's ``serve`` table, :mod:`harness.serving.server` runs the server as a
child process group, :mod:`harness.serving.loadgen` drives it with streaming requests and summarizes each level,
:mod:`harness.serving.run` measures one configuration and stores its record. What differs between engines (the
command line, how prompts are made, what makes a request generate exactly N tokens) is the engine's
``server.py`` (:class:`harness.engines.setup.ServerSetup`).
"""
