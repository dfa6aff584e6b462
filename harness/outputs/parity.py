"""Log-probability parity of one model run through two backends (``lctx compare RUN_A RUN_B``): in process, vLLM,
llama-server, llama-cpp-python. Researchers ask why vLLM and transformers disagree on the same checkpoint
(LongBench #95, vllm-project/vllm #11447); this lines the two runs up sample by sample and says where they part.

Per sample (task, length, depth, sample seed) present in both runs:

- ``prompt_ids``: the prompts' token-id digests (records' ``prompt_sha256``) equal: both backends saw the same ids;
- ``greedy``: the greedy answer texts (records' ``extra.continuation``, lm-eval's ``extra.pred``) equal;
- ``scores``: every metric both sides scored, equal within ``score_tol`` (exact, string_match, acc: 0/1 values;
  teacher-forced means within ``logprob_tol``); a metric one side could not give (``unavailable``) is named, not
  compared;
- ``max_logprob_diff``: the largest |difference| in nats over the log-probabilities both recorded for the same
  tokens: the answer tokens' teacher-forced log-probabilities (``extra.answer_logprobs``, passkey and the NIAH
  tasks), lm-eval's per-choice log-likelihoods (``extra.ll``), and ppl's mean NLL per token of the cell (a mean:
  it bounds no single token).

The run's verdict: ``same`` when every check holds on every sample; else the checks that failed, with counts.
Rules (``--rules`` TOML, a ``[parity]`` table): ``logprob_tol`` (nats, default :data:`LOGPROB_TOL`), ``score_tol``
(default 0), ``require`` (the checks that fail the gate, default all four). Exit 1 when a required check fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lctx.errors import LctxError
from lctx.harness.run.rundir import read_json
from lctx.harness.run.tables import current_map, latest_records, read_records, select_current, vet_records
from lctx.outside import safe

#: the default tolerance on a log-probability difference, nats: both sides in float32 differ by summation order only
#: (tests/test_server_vllm.py derives ~4e-4 for SmolLM2-135M; a quantised server against float32 needs its own)
LOGPROB_TOL = 1e-3
CHECKS = ("prompt_ids", "greedy", "scores", "logprobs")
KEY = ("task", "length", "depth", "sample")


@dataclass
class ParityRules:
    """What ``lctx compare RUN_A RUN_B`` gates on: ``logprob_tol`` (nats), ``score_tol`` (absolute, on every shared
    metric; teacher-forced log-probability means use ``logprob_tol``), ``require`` (a subset of :data:`CHECKS`)."""

    logprob_tol: float = LOGPROB_TOL
    score_tol: float = 0.0
    require: tuple = CHECKS


@dataclass
class Parity:
    """The result: ``table`` (one row per shared sample: the :data:`KEY` columns, ``model_a``, ``model_b``, one
    column per check, ``max_logprob_diff``, ``scores_max_diff``, ``only_a`` / ``only_b`` metrics), the run
    folders, the samples only one run has (``unmatched``), the rules, and the failed checks with their counts."""

    table: pd.DataFrame
    run_a: str
    run_b: str
    rules: ParityRules
    unmatched: int = 0
    failed: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """1 when a required check failed on some sample, else 0."""
        return 1 if any(k in self.rules.require for k in self.failed) else 0

    def verdict(self) -> str:
        """One line: ``same on N samples`` or the failed checks with counts (required ones marked)."""
        n = len(self.table)
        if not self.failed:
            return f"same on {n} sample{'s' if n != 1 else ''} (log-probabilities within {self.rules.logprob_tol:g} nats)"
        parts = [f"{k} differs on {v} of {n}" + ("" if k in self.rules.require else " (not required)")
                 for k, v in self.failed.items()]
        return "; ".join(parts)


def parity_rules(raw: dict | None) -> ParityRules:
    """A ``[parity]`` table of the rules file as :class:`ParityRules`.

    Raises:
        LctxError: an unknown key, a tolerance that is not a number >= 0, a check not in :data:`CHECKS`."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - {"logprob_tol", "score_tol", "require"})
    if unknown:
        raise LctxError(f"[parity] {', '.join(map(repr, unknown))}: unknown key; the keys are logprob_tol, score_tol, "
                        "require")
    out = ParityRules()
    for k in ("logprob_tol", "score_tol"):
        if k in raw:
            v = raw[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise LctxError(f"[parity] {k} = {v!r} is not a number >= 0; write e.g. {k} = 0.001")
            setattr(out, k, float(v))
    if "require" in raw:
        req = raw["require"]
        if not isinstance(req, list) or any(r not in CHECKS for r in req):
            raise LctxError(f"[parity] require = {req!r}: a list of {', '.join(CHECKS)}; write e.g. require = "
                            '["prompt_ids", "greedy"]')
        out.require = tuple(req)
    return out


def _records(run_dir: Path) -> list[dict]:
    """The current, vetted, one-per-sample records of a run folder.

    Raises:
        LctxError: no records.jsonl there."""
    path = Path(run_dir) / "records.jsonl"
    if not path.is_file():
        raise LctxError(f"{str(run_dir)!r} has no records.jsonl; pass two run folders written by lctx run")
    recs = read_records(path)
    recs = vet_records(recs, read_json(Path(run_dir) / "run.json"))
    recs, _ = select_current(recs, current_map(run_dir))
    return latest_records(recs)


def _pick_model(recs: list[dict], where: str, name: str | None) -> tuple[str, list[dict]]:
    models = sorted({str(r.get("model")) for r in recs})
    if name is not None:
        if name not in models:
            raise LctxError(f"{where} has no model {name!r} (it has {', '.join(models) or 'none'}); name one of them")
        models = [name]
    if len(models) != 1:
        raise LctxError(f"{where} holds {len(models)} models ({', '.join(models)}); name the pair with "
                        "--parity-models A=B")
    return models[0], [r for r in recs if str(r.get("model")) == models[0]]


def _key(r: dict) -> tuple:
    d = r.get("depth")
    return (r.get("task"), r.get("length"), float(d) if isinstance(d, (int, float)) else d, r.get("sample"))


def _numbers(v) -> list[float] | None:
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    return None


def _text(r: dict):
    extra = r.get("extra") or {}
    for k in ("continuation", "pred"):
        if isinstance(extra.get(k), (str, int, float)):
            return str(extra[k])
    return None


def compare_pair(a: dict, b: dict, rules: ParityRules) -> dict:
    """The checks of one sample's two records (module docstring): ``prompt_ids`` / ``greedy`` / ``scores`` /
    ``logprobs`` each "equal", "differ" or "n/a" (nothing to compare), with ``max_logprob_diff`` (nats; NaN when no
    log-probability was recorded on both sides), ``scores_max_diff`` and the metrics only one side has."""
    row: dict = {}
    pa, pb = a.get("prompt_sha256"), b.get("prompt_sha256")
    row["prompt_ids"] = "n/a" if pa is None or pb is None else ("equal" if pa == pb else "differ")
    ta, tb = _text(a), _text(b)
    row["greedy"] = "n/a" if ta is None or tb is None else ("equal" if ta == tb else "differ")
    ma, mb = a.get("metrics") or {}, b.get("metrics") or {}
    shared = sorted(set(ma) & set(mb))
    worst, bad = 0.0, False
    for m in shared:
        d = abs(float(ma[m]) - float(mb[m]))
        worst = max(worst, d)
        tol = rules.logprob_tol if m.startswith("tf_") or m == "nll" else rules.score_tol
        if m == "ppl":  # exp(nll): judged through nll
            continue
        bad |= not d <= tol
    row["scores"] = "n/a" if not shared else ("differ" if bad else "equal")
    row["scores_max_diff"] = worst if shared else float("nan")
    row["only_a"] = ",".join(sorted(set(ma) - set(mb)))
    row["only_b"] = ",".join(sorted(set(mb) - set(ma)))
    diffs: list[float] = []
    ea, eb = a.get("extra") or {}, b.get("extra") or {}
    for k in ("answer_logprobs", "ll"):
        la, lb = _numbers(ea.get(k)), _numbers(eb.get(k))
        if la is not None and lb is not None and len(la) == len(lb):
            diffs += [abs(x - y) for x, y in zip(la, lb)]
    if "nll" in ma and "nll" in mb:
        diffs.append(abs(float(ma["nll"]) - float(mb["nll"])))
    row["max_logprob_diff"] = max(diffs) if diffs else float("nan")
    row["logprobs"] = "n/a" if not diffs else ("equal" if max(diffs) <= rules.logprob_tol else "differ")
    return row


def parity(run_a: Path, run_b: Path, rules: ParityRules | None = None, models: tuple | None = None) -> Parity:
    """Line up the samples of ``run_a`` and ``run_b`` (one model each, or ``models`` = (name in A, name in B)) and
    check each pair (:func:`compare_pair`).

    Raises:
        LctxError: a folder without records, a model to name, no sample in both runs."""
    rules = rules or ParityRules()
    name_a, ra = _pick_model(_records(run_a), str(run_a), models[0] if models else None)
    name_b, rb = _pick_model(_records(run_b), str(run_b), models[1] if models else None)
    by_b = {_key(r): r for r in rb}
    rows = []
    for r in ra:
        other = by_b.get(_key(r))
        if other is None:
            continue
        rows.append({**dict(zip(KEY, _key(r))), "model_a": name_a, "model_b": name_b, **compare_pair(r, other, rules)})
    if not rows:
        raise LctxError(f"no sample of {str(run_a)!r} is in {str(run_b)!r} (task, length, depth, sample); run the "
                        "same grid through both backends")
    table = pd.DataFrame(rows).sort_values(list(KEY), key=lambda s: s.astype(str)).reset_index(drop=True)
    failed = {c: int((table[c] == "differ").sum()) for c in CHECKS if (table[c] == "differ").any()}
    return Parity(table, str(run_a), str(run_b), rules, unmatched=len(ra) + len(rb) - 2 * len(rows), failed=failed)


def write_parity(p: Parity, out_dir: Path) -> tuple[Path, Path]:
    """``parity.csv`` (every sample, every column) and ``parity.md`` (the verdict, then the samples that differ).

    Raises:
        LctxError: ``out_dir`` cannot be written."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        csv, md = out_dir / "parity.csv", out_dir / "parity.md"
        p.table.to_csv(csv, index=False)
        lines = ["# lctx compare: backend parity", "", f"- A: `{p.run_a}` (model {p.table['model_a'][0]})",
                 f"- B: `{p.run_b}` (model {p.table['model_b'][0]})", f"- samples in both: {len(p.table)}"
                 + (f"; in one run only: {p.unmatched}" if p.unmatched else ""), "", f"**{p.verdict()}**", ""]
        lp = p.table["max_logprob_diff"].dropna()
        if len(lp):
            lines += [f"Largest log-probability difference: {lp.max():.3g} nats (median {lp.median():.3g}).", ""]
        differ = p.table[(p.table[list(CHECKS)] == "differ").any(axis=1)]
        if len(differ):
            lines.append(differ.to_markdown(index=False))
        md.write_text(safe("\n".join(lines) + "\n"))
    except OSError as e:
        raise LctxError(f"cannot write to --out {str(out_dir)!r} ({e.strerror or e}); pass a writable directory") from None
    return csv, md
