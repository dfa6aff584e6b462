"""The one exception type for user mistakes: the CLI prints its message on one line and exits non-zero."""


class LctxError(Exception):
    """A user-facing error: bad input, a missing or corrupt checkpoint, unreadable data.

    The message must name the problem and the fix in one line, e.g.
    ``"checkpoint 'x/' has no config.json; pass a directory written by save_pretrained or lctx train"``.
    ``lctx`` catches it, prints ``error: <message>`` to stderr and exits with status 2.
    """
