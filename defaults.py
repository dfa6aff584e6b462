"""Every default of how lctx loads and runs a model, defined once (Architecture: ``chunk_size=2048`` was
written six times). The CLI's options (``cli.py``), :func:`lctx.evaluate`'s load defaults, ``load_lm``, the memory
plan, ``lctx bench`` and the server adapter import these names; ``tests/test_defaults.py`` fails on a second
definition (a parameter, option, field or dict entry of one of these concepts whose literal default equals the value
here, anywhere else in the package).

Plain constants: no import (the package root's lowest room; ``import lctx.cli`` pays nothing for it).
"""

from __future__ import annotations

#: where a checkpoint runs when ``--device`` is not given: ``"auto"`` = CUDA when available, else the CPU
#: (:func:`lctx.models.adapters.devices.resolve_device`)
DEVICE = "auto"
#: the weights' dtype when ``--dtype`` is not given (float32: the numbers of lctx's golden tests and baselines)
DTYPE = "float32"
#: prefill chunk in tokens (``--chunk-size``): a prompt is prefilled this many tokens at a time into the KV cache
CHUNK_SIZE = 2048
#: served models: the deadline of one request in seconds, from connect to the last byte (``--request-timeout``)
REQUEST_TIMEOUT_S = 600.0
#: served models: retries of one request on 429/5xx and reset connections, exponential back-off (``--retries``)
RETRIES = 4
#: served models: requests in flight at most over all servers (``--concurrency``)
CONCURRENCY = 1
#: mmlu/arc: the most lm-eval requests per forward when ``--batch-size`` is not given; the memory check lowers it to
#: the largest batch that fits (:func:`lctx.models.adapters.memory.check_lmeval_fits`)
LMEVAL_BATCH_SIZE = 32
#: the order samples run in (``--order``; :func:`lctx.harness.run.runner.order_cells`): per length, the deepest needle
#: first, so a server's prefix cache reuses each haystack; ``ORDERS``: every order known
ORDER = "cache"
ORDERS = ("cache", "grid", "shuffle")

#: what ``lctx run`` evaluates with no ``--model`` (folders under ``models/checkpoints``): the bundled demo pair, ALiBi and
#: GGD-BAM trained alike on pydoc text with a passkey in every window at 128 tokens (results/2026-12-05-demo-pair),
#: on ``DEMO_TASKS`` (passkey and ppl with ppl_ratio, flat_until and effective_length) at ``DEMO_RELATIVE`` times their
#: training length (128 to 1024 tokens) unless tasks or lengths are given
DEMO_MODELS = ("pydoc-passkey-alibi", "pydoc-passkey-ggd_bam")
DEMO_TASKS = "flatness"
DEMO_RELATIVE = "1,2,4,8"

#: {name: value} of every default above, for the test that finds a second definition and for messages
ALL = {"DEVICE": DEVICE, "DTYPE": DTYPE, "CHUNK_SIZE": CHUNK_SIZE, "REQUEST_TIMEOUT_S": REQUEST_TIMEOUT_S,
       "RETRIES": RETRIES, "CONCURRENCY": CONCURRENCY, "LMEVAL_BATCH_SIZE": LMEVAL_BATCH_SIZE, "ORDER": ORDER}
