"""lctx: a long-context evaluation harness for positional-encoding and attention-variant research.

The repository's top-level folders are installed as subpackages of ``lctx``:
``lctx.models`` (native decoder and attention variants), ``lctx.kernels`` (fast paths),
``lctx.tasks`` (passkey, ppl, custom tasks), ``lctx.harness`` (runner, tables, plots)
and ``lctx.cli`` (the ``lctx`` command).
"""

__version__ = "0.1.0"
