"""Sliding-window perplexity: every token of every document scored exactly once, token-weighted.

For a target ``length`` the model sees windows of ``window = length`` tokens (BOS included when the BOS
policy is ``prepend``) that advance by ``stride`` tokens; each window scores only the tokens no earlier
window scored, so token t is predicted from between ``window - stride`` and ``window`` tokens of context
(the Hugging Face "perplexity of fixed-length models" recipe). The reported NLL is the mean over all
scored tokens of all documents (not a mean of per-window means).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from lctx.metrics import ppl

from .base import Bound, Cell, RunOption, Sample, Task, register_task


def window_plan(n: int, window: int, stride: int, bos: bool) -> list[tuple[int, int, int]]:
    """Windows over a document of ``n`` tokens: a list of (begin, end, first_scored) token indices.

    The window feeds tokens [begin, end) (plus BOS in front when ``bos``), and scores targets
    [first_scored, end). Targets are 0..n-1 with BOS (token 0 is predicted from BOS alone) and 1..n-1
    without; each is scored exactly once.

    Raises:
        ValueError: window < 2, or stride not in [1, max_stride]: max_stride = window - 1 (with BOS the
            window holds window - 1 document tokens; without BOS the first token of a window has no
            context, so the next window must overlap the last by one token).
    """
    span = window - (1 if bos else 0)
    if window < 2:
        raise ValueError(f"window {window} is too small to score a token")
    max_stride = window - 1
    if not 1 <= stride <= max_stride:
        raise ValueError(f"stride {stride} must be in [1, {max_stride}] for window {window} "
                         "so that no token is skipped")
    plan, begin, scored_to = [], 0, (0 if bos else 1)
    while True:
        end = min(begin + span, n)
        first = max(scored_to, begin + (0 if bos else 1))
        if end > first:
            plan.append((begin, end, first))
        scored_to = end
        if end >= n:
            return plan
        begin += stride


def sliding_nll(nll_fn: Callable[[list[int], list[int]], list[float]], doc: list[int], window: int,
                stride: int, bos_id: int | None) -> tuple[float, int]:
    """Sum of NLL (nats) and count of scored tokens of one document under :func:`window_plan`.

    ``nll_fn(ids, targets)`` returns the NLL of ``ids[p]`` given ``ids[:p]`` for each p in targets.
    ``bos_id``: prepend this id to every window (``None``: no BOS, token 0 is not scored).
    """
    bos = bos_id is not None
    total, count = 0.0, 0
    for begin, end, first in window_plan(len(doc), window, stride, bos):
        ids = ([bos_id] if bos else []) + doc[begin:end]
        off = (1 if bos else 0) - begin
        nll = nll_fn(ids, [t + off for t in range(first, end)])
        total += float(sum(float(x) for x in nll))
        count += end - first
    return total, count


@register_task
class Perplexity(Task):
    """Sliding-window perplexity per context length.

    Options:
        data: list of text files or folders (default: the held-out part of Python's ``pydoc_data``
            topics, the bundled default corpus). A path not found as given is looked up below ``data_dir``.
            Recorded as :func:`lctx.paths.data_key` names them (relative to ``data_dir`` when the file
            lies there), so the same file spelled two ways is one cell. A missing path, or a folder without
            ``.txt`` files, is refused when the task is built (:func:`lctx.tasks.textdata.corpus_files`).
        data_dir: the data root (``--data-dir``); not itself recorded.
        stride: tokens between window starts; an int, or a float in (0, 1] as a fraction of the
            window (default 0.5).
        bos: ``"prepend"`` (each window starts with BOS, as lctx trains) or ``"none"``.
        short_docs: ``"drop"`` documents shorter than the window, or ``"count"`` them (scored with
            the tokens they have); the policy is recorded in the table.
        max_tokens: score at most the first ``max_tokens`` tokens of each document (default 32768;
            0 for all).
        concat: join all documents (separated by a blank line) into one before windowing.
        windows: instead of the sweep, score ``windows`` windows per length at seeded places:
            sample s is one window of ``length`` tokens starting at a token drawn from (seed, length, s) in a
            document drawn in proportion to its number of starts, scoring its last ``stride`` tokens (those with
            at least ``length - stride`` tokens of context, as in the sweep), so each length has ``windows``
            records and its mean an interval, where one sweep over a corpus no longer than the window is a
            single number. Needs a corpus of at least ``windows`` starts per length (``--ppl-max-tokens 0``
            keeps whole books); the records name each window's document and start.

    Metrics (one record per length, or per window with ``windows``): ppl = exp(nll), nll (mean nats per scored
    token), n_tokens (scored tokens), n_docs (documents scored).
    """

    name = "ppl"
    axes = ()
    metrics = ("ppl", "nll", "n_tokens", "n_docs")
    headline_metric = "ppl"
    higher_is_better = False
    uses_seed = False  # windows and documents are fixed: build ignores its seed (lctx compare matches any seed)
    description = "sliding-window perplexity (window = length, every token scored once)"
    requires = "--ppl-data files (default: Python's pydoc_data topics)"
    default_run = True  # `lctx run` without --tasks runs passkey and ppl
    keeps_logits = True  # HFAdapter.token_nll keeps a window's logits at every scored position (the memory check)
    plots = ("perplexity_vs_length",)
    run_options = (
        RunOption("--stride", "stride", "stride", 0.5,
                  "a fraction of the window in (0, 1] or a whole number of tokens, e.g. --stride 0.5"),
        RunOption("--window", "window", None, None, "ppl window sizes in tokens like --window 256,1k", lengths=True),
        RunOption("--ppl-data", "ppl_data", "data", None, "text files or folders of .txt files"),
        RunOption("--ppl-bos", "ppl_bos", "bos", "prepend", "prepend or none"),
        RunOption("--ppl-short-docs", "ppl_short_docs", "short_docs", "drop", "drop or count"),
        RunOption("--ppl-max-tokens", "ppl_max_tokens", "max_tokens", 32768, "0 (all) or a positive number of tokens"),
    )
    #: max_tokens: tokens kept per document (0: all), at most 2**31 (the longest length lctx runs); ``windows`` is
    #: bounded by the constructor (2 to 10 000 windows per length)
    option_bounds = {"max_tokens": Bound(0, 1 << 31, unit="tokens", why="the longest length lctx runs, 2**31")}

    def __init__(self, data: list[str] | None = None, stride: float = 0.5, bos: str = "prepend",
                 short_docs: str = "drop", max_tokens: int = 32768, concat: bool | None = None,
                 data_dir: str | os.PathLike | None = None, windows: int | None = None, **options):
        if bos not in ("prepend", "none"):
            raise ValueError(f"bos must be 'prepend' or 'none', got {bos!r}")
        if short_docs not in ("drop", "count"):
            raise ValueError(f"short_docs must be 'drop' or 'count', got {short_docs!r}")
        if not 0 < float(stride) < float("inf"):  # also refuses NaN
            raise ValueError(f"stride must be a positive finite number, got {stride}")
        if float(stride) > 1 and float(stride) != int(float(stride)):
            raise ValueError(f"stride {stride} is neither a whole number of tokens nor a fraction <= 1 of the window")
        if int(max_tokens) < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 = all), got {max_tokens}")
        if windows is not None and (isinstance(windows, bool) or not float(windows).is_integer()
                                    or not 2 <= int(windows) <= 10_000):
            raise ValueError(f"windows must be a whole number from 2 to 10000 (windows per length), got {windows!r}")
        concat = (data is None) if concat is None else concat
        if data:
            from lctx.paths import data_key, data_path  # lazy: only a run with --ppl-data needs it
            from lctx.tasks.textdata import MAX_TEXT_BYTES, check_file_size, corpus_files  # light

            root = Path(data_dir) if data_dir is not None else None
            data = [data_path(str(p), root) for p in data]
            for p in data:  # a missing path, an empty folder or a file past the cap: refused now, before torch
                for f in corpus_files(p):
                    check_file_size(f, MAX_TEXT_BYTES, "--ppl-data file")
            keys = [data_key(p, root) for p in data]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:  # it would be scored twice, and weigh double in the mean
                raise ValueError(f"--ppl-data names {twice[0]!r} twice; give each file once")
        extra = {"windows": int(windows)} if windows is not None else {}  # absent: the sweep's records unchanged
        super().__init__(data=keys if data else None, stride=stride, bos=bos, short_docs=short_docs,
                         max_tokens=max_tokens, concat=concat, **extra, **options)
        self.windows = int(windows) if windows is not None else None
        if self.windows:  # a sample axis of its own (the windows), drawn from the seed
            self.axes, self.uses_seed = ("sample",), True
        self.data, self.stride, self.bos = data, stride, bos
        self.short_docs, self.max_tokens, self.concat = short_docs, int(max_tokens), concat
        self._docs: list[tuple[str, str]] | None = None
        self._tokens: dict[int, list[list[int]]] = {}

    def documents(self) -> list[tuple[str, str]]:
        """(name, text) documents to score, loaded once.

        Raises:
            LctxError: a data path is missing or unreadable.
        """
        if self._docs is None:
            from lctx.tasks import textdata  # lazy: loads torch

            docs = (textdata.load_corpus(self.data, textdata.MAX_TEXT_BYTES) if self.data
                    else textdata.pydoc_corpus("heldout"))
            if self.concat:
                docs = [("+".join(n for n, _ in docs), "\n\n".join(t for _, t in docs))]
            self._docs = docs
        return self._docs

    def data_fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the documents as scored (names and cleaned text, after the
        optional concatenation): new contents under the same ``--ppl-data`` path, or another Python's
        ``pydoc_data``, are a different input."""
        from lctx.models.fingerprint import digest_texts  # lazy: loads torch

        return digest_texts(self.documents())

    def _doc_tokens(self, lm) -> list[list[int]]:
        """The documents' tokens with ``lm``'s tokenizer (cut at ``max_tokens``), once per tokenizer
        (:meth:`~lctx.models.adapters.protocol.ModelAdapter.tokenizer_fingerprint`)."""
        key = lm.tokenizer_fingerprint()
        if key not in self._tokens:
            toks = [lm.encode(text) for _, text in self.documents()]
            self._tokens[key] = [t[: self.max_tokens] if self.max_tokens else t for t in toks]
        return self._tokens[key]

    def check_windows(self, windows: list[int]) -> None:
        """Refuse a whole-number stride longer than one of the ``windows`` (tokens) it is to run at: there
        :meth:`window_stride` would cut it to ``window - 1`` and the records would name a stride the windows did
        not have. A stride equal to the window is allowed (no overlap: ``window - 1``, the most that skips no
        token); a fraction of the window always fits. ``lctx run`` calls it before torch loads with the lengths
        or ``--window`` sizes given, and again with ``--relative``'s once the training lengths are known.

        Raises:
            ValueError: a window shorter than the stride (names both); a fraction that is less than one token of a
                window (it would run as 1 token, not what the records name).
        """
        s = float(self.stride)
        short = [w for w in windows if s > 1 and s > w]
        if short:
            raise ValueError(f"stride {s:g} is longer than the shortest window ({min(short)} tokens: a length, "
                             "or --window)")
        tiny = [w for w in windows if s <= 1 and w >= 2 and round(s * (w - 1)) < 1]
        if tiny:  # window_stride would make it 1 token: a stride the records would not name (and one forward a token)
            w = max(tiny)
            raise ValueError(f"stride {s:g} of a {w}-token window is less than one token; use a fraction of at least "
                             f"{1 / (w - 1):.3g}, or a whole number of tokens (--stride 1 scores every token in its "
                             "own window, one forward each)")

    def check_lengths(self, lengths: list[int]) -> None:
        """:meth:`check_windows`: the lengths of ``ppl`` are its windows (:meth:`Task.check_lengths`).

        Raises:
            ValueError: a window shorter than a whole-number stride.
        """
        self.check_windows(lengths)

    def check_data(self) -> None:
        """Read the documents now (:meth:`documents`): unreadable data fails before any model loads
        (:meth:`Task.check_data`).

        Raises:
            LctxError: a data path is missing or unreadable.
        """
        self.documents()

    def window_stride(self, length: int) -> tuple[int, int]:
        """(window, stride) in tokens for a target length."""
        s = float(self.stride)
        stride = int(s) if s > 1 else max(1, int(round(s * (length - 1))))
        return length, min(stride, length - 1)

    def min_length(self, lm) -> int:
        """2: a window must hold a token and its context (:func:`window_plan`)."""
        return 2

    def cost(self, lm, cell: Cell) -> float:
        """Tokens fed to the model over every window of every scored document (:func:`window_plan`,
        BOS included): about ``window / stride`` times the scored tokens."""
        window, stride = self.window_stride(cell.length)
        if self.windows:
            return float(window)  # one window per sample
        bos = self.bos == "prepend"
        need = window - (1 if bos else 0)
        total = 0
        for d in self._doc_tokens(lm):
            if len(d) >= need or (self.short_docs == "count" and len(d) >= 2):
                total += sum(end - begin + bos for begin, end, _ in window_plan(len(d), window, stride, bos))
        return float(max(total, 1))

    def cells(self, lengths: list[int], depths: list[float], samples: int) -> list[Cell]:
        """One cell per length (the sweep), or ``windows`` per length (sample = the window's index; ``--samples``
        does not apply)."""
        return [Cell(int(L), None, s) for L in lengths for s in range(self.windows or 1)]

    def n_cells(self, n_lengths: int, n_depths: int, samples: int) -> int:
        """As :meth:`cells` counts them: ``windows`` (or 1) per length."""
        return int(n_lengths) * (self.windows or 1)

    def _uses_bos(self, lm) -> bool:
        """Whether windows start with the model's BOS: ``bos=prepend`` and the model has one (a tokenizer without a
        BOS, e.g. SmolLM2's, runs its windows without, as the sweep's :func:`sliding_nll` does with ``bos_id`` None)."""
        return self.bos == "prepend" and getattr(lm, "bos_id", None) is not None

    def _starts(self, lm, window: int) -> list[int]:
        """Per document, the number of places a full window can start (0 for one shorter than the window)."""
        span = window - (1 if self._uses_bos(lm) else 0)
        return [max(0, len(d) - span + 1) for d in self._doc_tokens(lm)]

    def _build_window(self, lm, cell: Cell, seed: int) -> Sample:
        """The sample of window ``cell.sample`` (the ``windows`` option): a seeded document and start.

        Raises:
            ValueError: the corpus has fewer than ``windows`` places for a window of this length.
        """
        import random  # light

        window, stride = self.window_stride(cell.length)
        starts = self._starts(lm, window)
        total = sum(starts)
        if total < self.windows:
            raise ValueError(f"the ppl data has {total} place{'s' if total != 1 else ''} for a {window}-token window "
                             f"and windows={self.windows} were asked; use --ppl-max-tokens 0 (whole documents), "
                             "longer or more documents, or fewer windows")
        rng = random.Random(f"ppl-window|{seed}|{cell.length}|{cell.sample}")
        k = rng.randrange(total)
        doc = 0
        while k >= starts[doc]:
            k -= starts[doc]
            doc += 1
        name = self.documents()[doc][0] if len(self.documents()) == len(starts) else str(doc)
        return Sample(cell=cell, input_ids=[], n_tokens=window,
                      meta={"window": window, "stride": stride, "bos": self.bos, "doc": name, "begin": k,
                            "n_starts": total, "_doc": doc})

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        if self.windows:
            return self._build_window(lm, cell, seed)
        window, stride = self.window_stride(cell.length)
        docs = self._doc_tokens(lm)
        need = window - (1 if self.bos == "prepend" else 0)
        keep = [d for d in docs if len(d) >= need or (self.short_docs == "count" and len(d) >= 2)]
        return Sample(cell=cell, input_ids=[], n_tokens=min(window, max((len(d) for d in keep), default=0)),
                      meta={"docs": keep, "window": window, "stride": stride, "short_docs": self.short_docs,
                            "bos": self.bos})

    def score(self, lm, sample: Sample) -> dict[str, float]:
        """Raises: ValueError when no document is long enough for this window (short_docs='drop')."""
        if self.windows:
            return self._score_window(lm, sample)
        docs = sample.meta.pop("docs")
        if not docs:
            raise ValueError(f"no document has {sample.meta['window']} tokens; use --ppl-short-docs count or "
                             "longer documents")
        bos_id = lm.bos_id if self.bos == "prepend" else None

        def nll_fn(ids, targets):
            return lm.token_nll(ids, targets)[0]

        total, count = 0.0, 0
        for doc in docs:
            t, c = sliding_nll(nll_fn, doc, sample.meta["window"], sample.meta["stride"], bos_id)
            total, count = total + t, count + c
        nll = total / count
        return {"ppl": ppl(nll), "nll": nll, "n_tokens": float(count), "n_docs": float(len(docs))}

    def _score_window(self, lm, sample: Sample) -> dict[str, float]:
        """NLL of one window's last ``stride`` tokens (context: the ``window - stride`` tokens before them, and
        BOS with ``bos=prepend``)."""
        m = sample.meta
        doc = self._doc_tokens(lm)[m.pop("_doc")]
        bos = self._uses_bos(lm)
        span = m["window"] - (1 if bos else 0)
        ids = ([lm.bos_id] if bos else []) + doc[m["begin"]:m["begin"] + span]
        first = len(ids) - min(m["stride"], len(ids) - 1)
        nll_values = lm.token_nll(ids, list(range(first, len(ids))))[0]
        nll = float(sum(float(x) for x in nll_values)) / len(nll_values)
        return {"ppl": ppl(nll), "nll": nll, "n_tokens": float(len(nll_values)), "n_docs": 1.0}
