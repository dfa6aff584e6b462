"""The one exception type for user mistakes, the exit codes of the ``lctx`` command, the error a
sample gets when the model's logits are not finite, and the one a metric gets that the model cannot give."""

import logging
import re

#: Exit codes of ``lctx`` (documented in docs/troubleshooting.md#exit-codes).
EXIT_OK = 0
EXIT_REGRESSION = 1  # lctx compare: the gate failed (a regression, an error or a missing cell)
EXIT_USAGE = 2  # a user mistake or damaged input: one ``error: ...`` line on stderr, nothing lost
EXIT_ALL_FAILED = 3  # lctx run: every sample of the run failed (status error); the records say why
EXIT_SOME_FAILED = 4  # lctx run: some samples of this run failed (status error), the others were scored
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT); 143 for SIGTERM: what finished is kept, rerun to resume


class LctxError(Exception):
    """A user-facing error: bad input, a missing or corrupt checkpoint, unreadable data.

    The message must name the problem and the fix in one line, e.g.
    ``"checkpoint 'x/' has no config.json; pass a directory written by save_pretrained or lctx train"``.
    ``lctx`` catches it, prints ``error: <message>`` to stderr and exits with status 2.
    """


class MetricUnavailable(LctxError):
    """A metric this model cannot give (reason in the message); recorded as unavailable, never 0."""


class ServerReplyError(ValueError):
    """A served model's reply that cannot be scored (an HTTP error after the retries, a timeout, HTML or malformed
    JSON where a completion was due, no choices, another model's name, a prompt the server counted otherwise than
    lctx sent it: cut or re-tokenised). The message names the server and what came back in one line; the runner
    records it as the sample's error as it is (no traceback location)."""


class ServerValueError(ServerReplyError):
    """A served model's reply with a value that cannot be: a log-probability that is NaN, infinite
    or above 0 by more than rounding (:data:`lctx.models.adapters.server.LOGPROB_TOL`), a ``usage`` count that is not
    a whole number >= 0 (a string, NaN, a bool, a fraction, a negative). Like any :class:`ServerReplyError` it makes
    the sample an error record, never a score; met by the trust probe or the tokenizer's fingerprint while the model
    loads, it ends the run in one line (exit 2)."""


class ServerUnreachable(LctxError):
    """A server that stopped answering (connections refused or reset after the retries) in the middle of a run:
    the run ends with this one line, every finished sample recorded, and the same command resumes once the server
    is back."""


class ContractError(ValueError):
    """A model adapter's output or a task's score that breaks its documented contract while a sample runs
    (docs/adapters.md, docs/custom-tasks.md): the message names the member or task, what it returned and the
    contract, and the runner records it as the sample's error as it is (no traceback location: the cause is named)."""


class NonFiniteLogitsError(ValueError):
    """The model produced NaN or +inf logits (or a row of only -inf) for a sample.

    Raised by the shared scoring path (:func:`check_finite_logits`, called on every logits tensor
    :class:`lctx.models.adapters.hf.HFAdapter` computes and on lm-eval's model calls), so every task's sample with
    non-finite logits is recorded with status ``error`` instead of a score computed from garbage.
    """


def check_finite_logits(logits, where: str = "forward") -> None:
    """Raise :class:`NonFiniteLogitsError` unless every row of ``logits`` [..., vocab] is usable: no NaN,
    no +inf and at least one finite entry (a -inf entry alone is a masked token and allowed).

    One max-reduction over the vocabulary (max propagates NaN), so the cost is one pass over the logits
    the model already computed.
    """
    import torch  # lazy: loads torch

    if logits.numel() == 0:
        return
    top = logits.detach().amax(dim=-1)
    if not bool(torch.isfinite(top).all()):
        bad = int((~torch.isfinite(top)).sum())
        kind = "NaN" if bool(torch.isnan(top).any()) else "infinite"
        raise NonFiniteLogitsError(f"{kind} logits at {bad} of {top.numel()} positions ({where}); "
                                   "the weights or the computation are broken (NaN/inf in the model)")


class CapturedLog:
    """Hold back what the ``transformers`` logger prints inside a ``with`` block (its default handler is
    detached, its records kept in :attr:`records`).

    On success call :meth:`replay` to print them as transformers would have; on failure lctx prints one
    line instead of transformers' multi-line load report, quoting :meth:`first_problem`.
    """

    def __enter__(self) -> "CapturedLog":
        from transformers.utils import logging as hf_logging  # lazy: loads transformers

        self.records: list = []
        outer = self

        class _Keep(logging.Handler):
            def emit(self, record):
                outer.records.append(record)

        self._handler = _Keep()
        self._hf = hf_logging
        hf_logging.disable_default_handler()
        hf_logging.add_handler(self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self._hf.remove_handler(self._handler)
        self._hf.enable_default_handler()

    def replay(self) -> None:
        """Send the held-back records to the transformers logger's handlers (after ``with``)."""

        root = logging.getLogger("transformers")
        for r in self.records:
            for h in root.handlers:
                if r.levelno >= h.level:
                    h.handle(r)

    def first_problem(self) -> str:
        """The first line of the held-back messages that names a key with a problem (MISMATCH, MISSING,
        UNEXPECTED), condensed to one line; "" when none does."""

        for r in self.records:
            for line in r.getMessage().splitlines():
                if re.search(r"\|\s*(MISMATCH|MISSING)\b", line):
                    return re.sub(r"\s*\|\s*", " ", line).strip()[:200]
        return ""


def split_list(text: str, what: str, example: str) -> list[str]:
    """The entries of a comma-separated option value, stripped (``"256, 512"`` -> ``["256", "512"]``).

    Raises:
        LctxError: an empty entry (``"256,,512"``, a leading or trailing comma) or no entry at all; the
            message names the option (``what``) and shows ``example``.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise LctxError(f"{what} is empty; write e.g. {example}")
    if not all(parts):
        raise LctxError(f"{what} {text!r} has an empty entry (two commas in a row, or a comma at an end); "
                        f"write e.g. {example}")
    return parts


def did_you_mean(name: str, known, n: int = 2) -> str:
    """``" (did you mean X?)"`` for the closest of ``known`` to ``name`` (difflib's ratio >= 0.6; up to ``n`` names),
    or ``""``: the hint a message about an unknown name carries."""
    import difflib  # light (stdlib)

    close = difflib.get_close_matches(str(name), sorted(map(str, known)), n=n, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""
