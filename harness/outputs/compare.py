"""Compare a run against a baseline run: the regression gate behind ``lctx compare``.

Both runs are read from their run directories (``summary.csv``; else ``results.parquet``/``results.csv``
or ``records.jsonl``, summarised by :func:`lctx.harness.run.tables.summarize`). Cells are matched on
(model, task, metric, length, depth), a run's model name going through the aliases first (``new=old``
renames run model ``new`` to baseline model ``old``, so a renamed checkpoint still matches). For each
matched cell the metric's *direction* says which way is better and its *tolerance* says how large a
difference must be to count:

- direction: ``higher`` (accuracy-like), ``lower`` (ppl, nll), ``equal`` (bookkeeping such as
  ``n_tokens``: any change beyond tolerance means the run measured something else, a regression) or
  ``ignore``. From the rules, else the task's ``higher_is_better`` dict (lm-eval's convention) as the run
  directories' ``run.json`` records it (``task_meta``; else the registered task class), else :data:`DIRECTIONS`.
- tolerance: ``abs`` (metric units), ``rel`` (fraction of |baseline mean|) and ``stderr`` (k: the
  difference must exceed k standard errors of the difference, sqrt(se_run^2 + se_base^2), the usual
  two-sample z criterion; a cell with n = 1 has no standard error and contributes 0). Combined, a
  difference counts only when it exceeds all of them: threshold = max(abs, rel |base|, k se). ``interval``
  (on / off, default off) adds one more condition: the run's 95 % interval (summary.csv's ``ci_low``,
  ``ci_high``: Wilson for 0/1 scores, t otherwise; :mod:`lctx.harness.run.intervals`) must exclude the baseline's
  mean; a run cell without an interval (one sample of a continuous metric, a summary from before intervals) is
  judged by the thresholds alone, and a zero-width one (every sample the same value) by the widest interval its
  metric's range allows (:func:`rule_interval`).

A matched cell whose two sides were made with different options (the label columns :data:`LABEL_COLUMNS`:
task options such as ppl's ``max_tokens`` or ``stride``, dtype, attn_impl, seed) measured different things:
its difference is no regression or improvement, and it gets the status ``incomparable`` with the options
that differ ("max_tokens: run 32768, baseline 2048"), unless the options may differ (``allow_option_changes``).
A cell that holds several option sets on a side (one run directory, two ppl strides) pairs its sets by their
options, within that cell alone (:func:`_match_cells`): a cell's verdict never depends on other cells. The rows of
such a cell name the options that tell them apart (``option_set``, "key_digits=3"; the printed note shows it).

Positional methods: a checkpoint evaluated under a method is a model of its own (``{base}+{label}``,
run.json's ``inputs.models[name]["position"]``), so it is gated like any model: its cells pair with the baseline's
same (base, method) by name, the printed table and ``compare.csv`` name the method (``method``), a method recorded
with other options on the two sides makes its cells ``incomparable`` (:data:`POSITION`), and ``--alias new=old`` of a
base renames its methods' models too.

Each cell gets a status: ``regression``, ``error`` (the run's samples failed where the baseline's did
not, or every sample of the run's cell failed, whatever the baseline holds), ``incomparable`` (options differ), ``missing`` (in the baseline, not in the run), ``improvement``,
``new`` (in the run only), ``unavailable`` (a side's model could not give the metric, e.g. a server without prompt
log-probabilities: not comparable, the reason in the note; never a regression or an improvement, and it does not
fail the gate) or ``same`` (within tolerance). The gate fails on regression or error (exit 1),
on missing unless allowed (exit 1), and on incomparable cells (exit 2: the gate compared the wrong runs).

Outside text: the summaries read are redacted (:func:`lctx.harness.run.tables.clean_frame`), what is
printed goes through :mod:`lctx.harness.run.console` (redacted, control characters escaped), ``compare.csv`` and
``compare.md`` are written redacted and escaped, and a reason too long for a table cell (a served model's trust probe
reason, hundreds of characters) is printed once above the table, capped (:func:`lctx.outside.quote`), its cells
naming it by number (:func:`long_reasons`).
"""

from __future__ import annotations

import difflib
import json
import math
import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from lctx.errors import LctxError
from lctx.metrics import METRICS, direction_of

from lctx.harness.run.console import print_line, print_table, say
from lctx.harness.run.rundir import check_regular, declared_tasks, read_json
from lctx.harness.run.tables import (SHORT_REASON, clean_frame, name_foreign_records, read_records, summarize, to_table,
                                     vet_records)
from lctx.outside import quote, safe

KEYS = ["model", "task", "metric", "length", "depth"]
SUMMARY_COLUMNS = ["model", "variant", "task", "metric", "length", "depth", "mean", "stderr", "n", "n_error"]
#: the 95 % interval of a cell (summary.csv; NaN when a summary has none)
INTERVAL_COLUMNS = ["ci_low", "ci_high"]
VALID_DIRECTIONS = ("higher", "lower", "equal", "ignore")

# Which way is better, by metric name (a ",filter" suffix as in lm-eval's "acc,none" is dropped first): every
# metric lctx registers (lctx.metrics.METRICS, its direction) and these names other engines write into tables
# lctx may compare (lm-eval's perplexities and generation scores)
OTHER_DIRECTIONS: dict[str, str] = {
    "loss": "lower", "bpb": "lower", "bits_per_byte": "lower", "word_perplexity": "lower", "byte_perplexity": "lower",
    "perplexity": "lower", "accuracy": "higher", "exact_match": "higher", "string_match": "higher", "f1": "higher",
    "em": "higher", "flat_length": "higher",
}
#: the directions known at import (registered metrics read live by :meth:`Rules.direction_for`)
DIRECTIONS: dict[str, str] = {**OTHER_DIRECTIONS, **{m.name: m.direction for m in METRICS.values()}}

# Statuses, in the order they are reported.
STATUSES = ("regression", "error", "incomparable", "missing", "improvement", "new", "unavailable", "same", "ignored")
FAILING = ("regression", "error")

#: the positional method of a checkpoint as shipped (run.json ``inputs.models[name]["position"]["method"]``)
SHIPPED = "shipped"
#: the column :func:`compare_dirs` adds to both summaries from run.json: each model's positional method, options and
#: layer type (canonical JSON; blank where a run records none). It is compared as an option of the cell
#: (:func:`option_differences`): a model name measured under another method or other options is another measurement
POSITION = "position"


def run_positions(meta: dict | None) -> dict[str, dict]:
    """{model name: its positional method} of a run directory's ``run.json`` (``inputs.models[name]["position"]``:
    {"base", "method", "options", "layer_type", "effective"}); {} for a run that records none (written
    before positional methods, or by hand)."""
    inputs = (meta or {}).get("inputs") if isinstance((meta or {}).get("inputs"), dict) else {}
    models = inputs.get("models") if isinstance(inputs.get("models"), dict) else {}
    return {str(name): entry["position"] for name, entry in models.items()
            if isinstance(entry, dict) and isinstance(entry.get("position"), dict) and entry["position"].get("method")}


def method_label(position: dict, name: str = "", variant: object = None) -> str:
    """How a model's positional method is named in a table: ``shipped``, or the method and the options that differ
    from its defaults as ``--position`` writes them (``yarn:factor=4``): the record's ``label`` when it has one, else
    the part of the variant from ``+NAME`` (a method's variant is ``{variant}+{NAME}:{k=v,...}``), else the model
    name's suffix after ``{base}+`` (``yarn_factor4``), else the method and every option it records.
    ``position``: a :func:`run_positions` record; ``name``, ``variant``: the model's."""
    if position.get("label"):
        return str(position["label"])
    method = str(position.get("method") or "")
    if not method or method == SHIPPED:
        return SHIPPED
    v = "" if _blank(variant) else str(variant)
    i = v.find("+" + method)
    end = i + 1 + len(method)
    if i >= 0 and (end == len(v) or v[end] == ":"):
        return v[i + 1:]
    base = str(position.get("base") or "")
    if base and str(name).startswith(base + "+"):
        return str(name)[len(base) + 1:]
    return _position_text(position)


def _position_text(position: dict) -> str:
    """``NAME:k=v,...`` with every option a position record holds (defaults included), and its layer type."""
    opts = position.get("options") if isinstance(position.get("options"), dict) else {}
    text = str(position.get("method") or "") + (":" + ",".join(f"{k}={opts[k]}" for k in sorted(opts)) if opts else "")
    return text + (f" [{position['layer_type']}]" if position.get("layer_type") else "")


def position_key(position: dict | None) -> str:
    """What :data:`POSITION` holds of a position record: {"method", "options", "layer_type"} as canonical JSON ("" for
    none); the effective parameters are left out (they follow from these and the checkpoint, which the run's
    fingerprints cover)."""
    if not position:
        return ""
    return json.dumps({"method": position.get("method"), "options": position.get("options") or {},
                       "layer_type": position.get("layer_type")}, sort_keys=True, default=str)


def with_positions(df: pd.DataFrame, meta: dict | None) -> pd.DataFrame:
    """A summary with three columns from its run's ``run.json`` (:func:`run_positions`): ``method`` (:func:`method_label`,
    "" for a model without a record), :data:`POSITION` (:func:`position_key`) and ``position_base`` (the base model's
    name, through which ``--alias`` renames a method's model, :func:`compare_runs`)."""
    pos = run_positions(meta)
    df = df.copy()
    rec = [pos.get(str(m)) for m in df["model"]]
    variants = df["variant"] if "variant" in df.columns else [None] * len(df)
    df["method"] = [method_label(p, m, v) if p else "" for p, m, v in zip(rec, df["model"], variants)]
    df[POSITION] = [position_key(p) for p in rec]
    df["position_base"] = [str(p.get("base") or m) if p else "" for p, m in zip(rec, df["model"])]
    return df


@dataclass(frozen=True)
class Tolerance:
    """How large a difference must be to count (all >= 0; a difference counts when it exceeds each).

    abs: metric units; rel: fraction of |baseline mean|; stderr: k, in standard errors of the difference;
    interval: 1 (on) = a difference counts only when the run's 95 % interval also excludes the baseline mean.
    """

    abs: float = 0.0
    rel: float = 1e-6  # float-noise floor
    stderr: float = 2.0
    interval: float = 0.0

    def threshold(self, base: float, se_diff: float) -> tuple[float, str]:
        """(threshold in metric units, which tolerance sets it: "abs", "rel" or "stderr")."""
        parts = {"abs": self.abs, "rel": self.rel * abs(base),  # interval is a condition, not a threshold
                 "stderr": self.stderr * se_diff if math.isfinite(se_diff) else 0.0}
        which = max(parts, key=parts.get)
        return parts[which], which


@dataclass
class Rules:
    """Directions, tolerances and aliases for :func:`compare_runs`.

    tolerance: fields for every metric (merged over :class:`Tolerance`'s defaults);
    metrics: {"ppl" or "task.metric": {"direction": ..., "abs"/"rel"/"stderr": ...}};
    alias: {run model name: baseline model name};
    parity: the ``[parity]`` table for ``lctx compare RUN_A RUN_B`` (:class:`lctx.harness.outputs.parity.ParityRules`)
    or None (its defaults).
    """

    tolerance: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    alias: dict = field(default_factory=dict)
    parity: object = None

    def merged(self, other: Rules) -> Rules:
        """These rules overridden field by field by ``other`` (e.g. CLI flags over a rules file)."""
        metrics = {k: dict(v) for k, v in self.metrics.items()}
        for k, v in other.metrics.items():
            metrics.setdefault(k, {}).update(v)
        return Rules({**self.tolerance, **other.tolerance}, metrics, {**self.alias, **other.alias})

    def _metric_rules(self, task: str, metric: str) -> dict:
        out = dict(self.metrics.get(_base_metric(metric), {}))
        out.update(self.metrics.get(metric, {}))
        out.update(self.metrics.get(f"{task}.{metric}", {}))
        return out

    def tolerance_for(self, task: str, metric: str) -> Tolerance:
        """The tolerance of one (task, metric): defaults < rules' ``tolerance`` < metric < task.metric."""
        fields = {**self.tolerance, **{k: v for k, v in self._metric_rules(task, metric).items() if k != "direction"}}
        return replace(Tolerance(), **fields)

    def direction_for(self, task: str, metric: str, declared: dict | None = None) -> str | None:
        """``higher``/``lower``/``equal``/``ignore`` for one (task, metric), or None when nothing says.
        ``declared``: the tasks' metadata the run directories recorded (:func:`lctx.harness.run.rundir.declared_tasks`),
        read before the task registry."""
        d = self._metric_rules(task, metric).get("direction")
        if d:
            return d
        d = _task_direction(task, metric, declared)
        return d or direction_of(metric) or OTHER_DIRECTIONS.get(_base_metric(metric))


def _base_metric(metric: str) -> str:
    return metric.split(",", 1)[0]


def _task_direction(task: str, metric: str, declared: dict | None = None) -> str | None:
    """A task's own ``higher_is_better``: {metric: bool} (lm-eval's convention), or a bool for its headline
    metric (:attr:`lctx.tasks.Task.higher_is_better`), as its run directory recorded it (``declared[task]``,
    run.json's ``task_meta``: a ``--task-file`` task needs no task file here), else as its registered class
    declares it; None when it declares nothing."""
    rec = (declared or {}).get(task)
    if isinstance(rec, dict) and isinstance(rec.get("higher_is_better"), dict):
        hib = rec["higher_is_better"].get(metric)
        return None if not isinstance(hib, bool) else "higher" if hib else "lower"
    try:
        from lctx.tasks import TASKS  # lazy: loads torch (every task registers); compare runs without it
    except Exception:  # noqa: BLE001 - the table lookup must not depend on the task registry importing
        return None
    cls = TASKS.get(task)
    hib = getattr(cls, "higher_is_better", None)
    if isinstance(hib, dict) and metric in hib:
        return "higher" if hib[metric] else "lower"
    if isinstance(hib, bool) and metric == cls.headline():
        return "higher" if hib else "lower"
    return None


def _task_uses_seed(task: str, declared: dict | None = None) -> bool:
    """Whether a task's samples depend on ``--seed`` (:attr:`lctx.tasks.Task.uses_seed`; ppl's do not), as its
    run directory recorded it (``declared[task]``), else its registered class: only then do two seeds make its
    cells incomparable. True (the safe side) for a task neither records nor registers."""
    rec = (declared or {}).get(task)
    if isinstance(rec, dict) and isinstance(rec.get("uses_seed"), bool):
        return rec["uses_seed"]
    try:
        from lctx.tasks import TASKS  # lazy: loads lctx.tasks; compare runs without it
    except Exception:  # noqa: BLE001 - as _task_direction
        return True
    cls = TASKS.get(task)
    return bool(getattr(cls, "uses_seed", True)) if cls is not None else True


# ---------------------------------------------------------------------------------------------- parsing

def _check_tolerance_fields(fields: dict, where: str, typed: bool = False) -> dict:
    """Check tolerance fields; ``typed`` (a rules file): values must be TOML numbers, not strings or
    booleans (``abs = "1e9"`` or ``abs = true`` would otherwise pass as 1e9 / 1.0)."""
    out = {}
    for k, v in fields.items():
        if k not in ("abs", "rel", "stderr", "interval"):
            raise LctxError(f"{where}: unknown tolerance {quote(repr(k), 80)}; use abs, rel, stderr or interval")
        if k == "interval":  # on / off: true / false in a rules file, 1 / 0 (or true / false) on the command line
            if typed and not isinstance(v, bool):
                raise LctxError(f"{where}: tolerance interval = {quote(repr(v), 80)} is not a boolean; write interval = true "
                                "(gate only where the run's 95 % interval excludes the baseline) or false")
            text = str(v).strip().lower()
            if isinstance(v, bool) or text in ("true", "false", "1", "0", "on", "off", "1.0", "0.0"):
                out[k] = 1.0 if (v is True or text in ("true", "1", "on", "1.0")) else 0.0
                continue
            raise LctxError(f"{where}: tolerance interval = {quote(repr(v), 80)}; write interval=on or interval=off on the command "
                            "line, interval = true or false in a rules file (on: gate only where the run's 95 % "
                            "interval excludes the baseline)")
        if typed and (isinstance(v, bool) or not isinstance(v, (int, float))):
            kind = "a boolean" if isinstance(v, bool) else ("a string" if isinstance(v, str) else type(v).__name__)
            raise LctxError(f"{where}: tolerance {k} = {quote(repr(v), 80)} is {kind}, not a number; write a bare number, "
                            f"e.g. {k} = 0.01")
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise LctxError(f"{where}: tolerance {k} = {quote(repr(v), 80)} is not a number; write e.g. {k} = 0.01") from None
        if not (v >= 0 and math.isfinite(v)):
            raise LctxError(f"{where}: tolerance {k} = {v} must be a finite number >= 0")
        out[k] = v
    return out


def parse_tolerances(items: list[str]) -> Rules:
    """Parse ``--tolerance`` values: ``abs=0.01,rel=0.02,stderr=2`` (every metric) or
    ``ppl:rel=0.02`` / ``passkey.exact:abs=0.1`` (one metric).

    Raises:
        LctxError: an item that is not [METRIC:]KEY=VALUE[,KEY=VALUE], an unknown key, a negative value.
    """
    rules = Rules()
    for item in items:
        metric, spec = (item.split(":", 1) if ":" in item else (None, item))
        fields = {}
        for part in [p.strip() for p in spec.split(",") if p.strip()]:
            if "=" not in part:
                raise LctxError(f"--tolerance {item!r} is not [METRIC:]KEY=VALUE; write e.g. --tolerance rel=0.01 "
                                "or --tolerance ppl:rel=0.02,stderr=2")
            k, v = part.split("=", 1)
            fields[k.strip()] = v.strip()
        if not fields:
            raise LctxError(f"--tolerance {item!r} is empty; write e.g. --tolerance abs=0.05")
        fields = _check_tolerance_fields(fields, f"--tolerance {item!r}")
        if metric is None:
            rules.tolerance.update(fields)
        else:
            rules.metrics.setdefault(metric.strip(), {}).update(fields)
    return rules


def parse_aliases(items: list[str]) -> dict:
    """Parse ``--alias new=old`` values into {run model name: baseline model name}.

    Raises:
        LctxError: an item without "=" or with an empty side.
    """
    out = {}
    for item in items:
        new, sep, old = item.partition("=")
        if not sep or not new.strip() or not old.strip():
            raise LctxError(f"--alias {item!r} is not NEW=OLD; write e.g. --alias my-model-v2=my-model")
        out[new.strip()] = old.strip()
    return out


def load_rules(path: Path) -> Rules:
    """Read a rules file (TOML, :mod:`tomllib`)::

        [tolerance]              # every metric (defaults: abs = 0, rel = 1e-6, stderr = 2)
        stderr = 2
        [metrics.ppl]            # one metric; [metrics."passkey.exact"] for one task's metric
        direction = "lower"      # higher | lower | equal | ignore
        rel = 0.01
        [alias]
        "my-model-v2" = "my-model"   # run model name = baseline model name
        [parity]                 # lctx compare RUN_A RUN_B (backend parity): lctx.harness.outputs.parity
        logprob_tol = 0.001

    Raises:
        LctxError: unreadable file, TOML syntax error, unknown table or key, bad direction or tolerance.
    """
    try:
        import tomllib  # Python >= 3.11 (only load_rules reads TOML)
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # Python 3.10: the backport
        except ModuleNotFoundError:
            raise LctxError("reading --rules needs Python 3.11+ (tomllib) or `pip install tomli`") from None

    if not check_regular(Path(path), f"--rules {str(path)!r}", fix="pass the path of a TOML rules file"):
        raise LctxError(f"cannot read --rules {str(path)!r} (it does not exist); pass a TOML rules file")
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise LctxError(f"cannot read --rules {str(path)!r} ({e.strerror or e}); pass a TOML rules file") from None
    except UnicodeDecodeError:
        raise LctxError(f"--rules {str(path)!r} is not a text file; pass a TOML rules file") from None
    except tomllib.TOMLDecodeError as e:
        raise LctxError(f"--rules {str(path)!r} is not valid TOML ({quote(e)}); fix the file "
                        "(see docs/compare-ci.md#the-rules-file)") from None
    except (RecursionError, MemoryError):
        raise LctxError(f"--rules {str(path)!r} is nested too deeply to read; a rules file has tables two levels "
                        "deep ([metrics.NAME]); fix the file") from None
    where = f"--rules {str(path)!r}"
    unknown = set(data) - {"tolerance", "metrics", "alias", "parity"}
    if unknown:
        raise LctxError(f"{where}: unknown table {quote(repr(min(unknown)), 80)}; use [tolerance], [metrics.NAME], "
                        "[alias] or [parity]")
    for name in ("tolerance", "metrics", "alias", "parity"):
        if name in data and not isinstance(data[name], dict):
            raise LctxError(f"{where}: {name!r} must be a table, e.g. [{name}]")
    rules = Rules(tolerance=_check_tolerance_fields(data.get("tolerance", {}), f"{where} [tolerance]", typed=True))
    if "parity" in data:  # lctx compare RUN_A RUN_B (lctx.harness.outputs.parity); checked there
        from lctx.harness.outputs.parity import parity_rules  # lazy: only a rules file with [parity] needs it

        rules.parity = parity_rules(data["parity"])
    for metric, spec in data.get("metrics", {}).items():
        if not isinstance(spec, dict):
            raise LctxError(f"{where}: metrics.{metric} must be a table, e.g. [metrics.{metric}] direction = \"lower\"")
        spec = dict(spec)
        d = spec.pop("direction", None)
        entry = _check_tolerance_fields(spec, f"{where} [metrics.{metric}]", typed=True)
        if d is not None:
            if not isinstance(d, str) or d not in VALID_DIRECTIONS:
                raise LctxError(f"{where}: metrics.{quote(metric, 80)}.direction = {quote(repr(d), 80)}; use one of "
                                f"{', '.join(VALID_DIRECTIONS)}")
            entry["direction"] = d
        rules.metrics[metric] = entry
    for new, old in data.get("alias", {}).items():
        if not isinstance(old, str) or not old:
            raise LctxError(f"{where}: alias {quote(repr(new), 80)} must map to a baseline model name (a string)")
        rules.alias[new] = old
    return rules


# ---------------------------------------------------------------------------------------------- reading

def _warn(msg: str) -> None:
    say(msg, err=True)


def load_summary(run_dir: Path, what: str = "run") -> pd.DataFrame:
    """The summary table of a run directory (columns :data:`SUMMARY_COLUMNS` plus the label columns
    :data:`LABEL_COLUMNS` it has, and :data:`UNAVAILABLE_COLUMNS`, blank / 0 in a summary written before they
    existed; one row per cell).

    Reads ``summary.csv``; without it, summarises ``results.parquet``, ``results.csv`` or ``records.jsonl``.
    Every row is checked: ``model``, ``task`` and ``metric`` non-empty; ``length`` empty (tasks without a
    length axis: mmlu, arc_*) or a positive integer; ``depth`` empty or a number; ``mean``/``stderr``
    empty or numbers; ``n``/``n_error`` counts.

    Raises:
        LctxError: not a directory, no readable table, missing columns, a bad value (the row is named), or
            no rows (an empty run).
    """

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        from lctx.errors import did_you_mean  # light

        siblings = [str(p) for p in run_dir.parent.iterdir() if (p / "run.json").is_file() or (p / "summary.csv").is_file()
                    ] if run_dir.parent.is_dir() else []  # run directories only
        raise LctxError(f"{what} {str(run_dir)!r} is not a directory{did_you_mean(str(run_dir), siblings, n=1)}; pass a "
                        "run directory written by lctx run")
    src = "summary.csv"
    try:
        if check_regular(run_dir / "summary.csv"):
            df = pd.read_csv(run_dir / "summary.csv", dtype=str, keep_default_na=False)
        elif check_regular(run_dir / "results.parquet"):
            src, df = "results.parquet", summarize(pd.read_parquet(run_dir / "results.parquet"))
        elif check_regular(run_dir / "results.csv"):
            src, df = "results.csv", summarize(pd.read_csv(run_dir / "results.csv"))
        elif check_regular(run_dir / "records.jsonl"):
            src, path = "records.jsonl", run_dir / "records.jsonl"
            try:
                meta = read_json(run_dir / "run.json")
            except LctxError:
                meta = None  # damaged: compare_dirs names it
            df = summarize(to_table(vet_records(read_records(path, _warn), meta, _warn, str(path))))
        else:
            raise LctxError(f"{what} {str(run_dir)!r} has no summary.csv, results or records.jsonl; "
                            "pass a run directory written by lctx run")
    except LctxError:
        raise
    except pd.errors.EmptyDataError:
        raise LctxError(f"{what} {str(run_dir)!r} has an empty summary.csv; rerun lctx run into it") from None
    except Exception as e:  # noqa: BLE001 - a corrupt table is the user's input, not our bug
        raise LctxError(f"{what} {str(run_dir)!r}: unreadable table ({type(e).__name__}: {quote(e, 120)}); "
                        "rerun lctx run into it") from None
    if src != "records.jsonl":  # lctx run wrote the tables from the records run.json vouches for: name the others
        name_foreign_records(run_dir, _warn)
    missing = [c for c in SUMMARY_COLUMNS if c not in df.columns and c not in ("variant", "n_error")]
    if missing:
        raise LctxError(f"{what} {str(run_dir)!r}: {src} lacks columns {missing}; "
                        "pass a run directory written by lctx run")
    if df.empty:
        raise LctxError(f"{what} {str(run_dir)!r} has no results (empty summary); run lctx run into it first")
    df = clean_frame(df)  # redacted as read: a summary written before lctx redacted keys too
    df = _checked_summary(df.reset_index(drop=True), f"{what} {str(run_dir)!r}: {src}")
    if src == "summary.csv" and any(c not in df.columns for c in LABEL_COLUMNS):
        df = _labels_from_results(run_dir, df)
    return df


def _labels_from_results(run_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """A ``summary.csv`` written before lctx put the options in it (e.g. a committed baseline) gets its cells'
    options (:data:`LABEL_COLUMNS`) from the run's ``results.parquet``/``results.csv``, where each sample
    recorded them; a cell the results give several option sets is left without (it cannot be told which)."""
    try:
        if check_regular(run_dir / "results.parquet"):
            res = pd.read_parquet(run_dir / "results.parquet")
        elif check_regular(run_dir / "results.csv"):
            res = pd.read_csv(run_dir / "results.csv")
        else:
            return df
    except Exception:  # noqa: BLE001 - the options are a help; the summary itself was readable
        return df
    have = [c for c in LABEL_COLUMNS if c in res.columns and c not in df.columns]
    if not have:
        return df
    lab = summarize(res)[KEYS + have]
    lab = lab[~lab.duplicated(KEYS, keep=False)].copy()
    lab["length"] = pd.to_numeric(lab["length"], errors="coerce").astype(float)
    lab["depth"] = pd.to_numeric(lab["depth"], errors="coerce").astype(float)
    for c in have:
        lab[c] = lab[c].map(lambda v: "" if _blank(v) else str(v))
    out = df.merge(lab, on=KEYS, how="left")
    for c in have:
        out[c] = out[c].fillna("")
    return out


LABEL_COLUMNS = ["task_options", "dtype", "attn_impl", "seed"]
#: the summary's count of samples whose metric the model could not give and their reason
#: (:func:`lctx.harness.run.tables.summarize`)
UNAVAILABLE_COLUMNS = ["n_unavailable", "unavailable"]


def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip()) \
        or v is pd.NA


def _checked_summary(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Typed summary columns, or an LctxError naming the first bad row (row 1 = the first data row)."""

    def bad(i, col, v, want):
        raise LctxError(f"{where} row {i + 1}: {col} {quote(repr(v), 80)} is not {want}; fix the row or rewrite the file with "
                        "lctx run")

    def number(i, col, v, blank_ok=True):
        if _blank(v):
            if blank_ok:
                return math.nan
            bad(i, col, "" if v is None else v, "a number")
        try:
            x = float(v)
        except (TypeError, ValueError):
            bad(i, col, v, "a number")
        return x

    out = {c: [] for c in SUMMARY_COLUMNS + INTERVAL_COLUMNS + UNAVAILABLE_COLUMNS
           + [c for c in LABEL_COLUMNS if c in df.columns]}
    for i, r in enumerate(df.to_dict("records")):
        for col in ("model", "task", "metric"):
            if _blank(r.get(col)):
                bad(i, col, "" if r.get(col) is None else r.get(col), "a name (it is empty)")
            out[col].append(str(r[col]).strip())
        out["variant"].append(None if _blank(r.get("variant")) else str(r["variant"]))
        L = number(i, "length", r.get("length"))
        if not math.isnan(L) and (L <= 0 or L != int(L)):
            bad(i, "length", r.get("length"), "a positive whole number of tokens (or empty)")
        out["length"].append(L)
        d = number(i, "depth", r.get("depth"))
        out["depth"].append(d)
        out["mean"].append(number(i, "mean", r.get("mean")))
        out["stderr"].append(number(i, "stderr", r.get("stderr")))
        for col in INTERVAL_COLUMNS:
            out[col].append(number(i, col, r.get(col)))
        for col, blank_ok in (("n", False), ("n_error", True), ("n_unavailable", True)):
            v = r.get(col)
            x = 0.0 if (blank_ok and _blank(v)) else number(i, col, v, blank_ok=False)
            if x < 0 or x != int(x):
                bad(i, col, v, "a count")
            out[col].append(int(x))
        out["unavailable"].append("" if _blank(r.get("unavailable")) else str(r["unavailable"]).strip())
        for col in LABEL_COLUMNS:
            if col in out:
                v = r.get(col)
                out[col].append("" if _blank(v) else str(v))
    res = pd.DataFrame({k: v for k, v in out.items()})
    return res


# ---------------------------------------------------------------------------------------------- compare

@dataclass
class Comparison:
    """The outcome of :func:`compare_runs`.

    table: one row per cell (columns :data:`TABLE_COLUMNS`), ordered by :data:`STATUSES`;
    counts: {status: n}; failed: whether the gate fails (regression/error, or missing when not allowed).
    """

    table: pd.DataFrame
    counts: dict
    failed: bool
    run_dir: str = ""
    baseline_dir: str = ""
    allow_missing: bool = False

    @property
    def exit_code(self) -> int:
        """0 when the gate passes; 1 when it fails on a regression, an error or a missing cell; 2 when it fails
        only because cells are incomparable (their options differ: the gate was given the wrong runs)."""
        if not self.failed:
            return 0
        return 2 if self.counts.get("incomparable") and not self.judged_failed else 1

    @property
    def judged_failed(self) -> bool:
        """Whether a judged cell fails the gate: a regression, an error, or a missing cell not allowed."""
        return bool(self.counts.get("regression") or self.counts.get("error")
                    or (self.counts.get("missing") and not self.allow_missing))

    def option_notes(self) -> list[str]:
        """One line per task whose cells are incomparable: the task, how many cells, the options that differ."""
        t = self.table[self.table["status"] == "incomparable"]
        return [f"{task} ({len(g)} cells): {'; '.join(dict.fromkeys(g['options']))}"
                for task, g in t.groupby("task", sort=True)]


TABLE_COLUMNS = ["status", "model", "baseline_model", "method", "variant", "task", "metric", "length", "depth", "direction",
                 "base_mean", "base_stderr", "base_n", "run_mean", "run_stderr", "run_n", "diff", "rel_diff", "z",
                 "threshold", "bound_by", "run_n_error", "base_n_error", "options", "option_set", "unavailable",
                 "run_ci_low", "run_ci_high", "base_ci_low", "base_ci_high"]


def _near(name: str, known) -> str:
    """``"; did you mean X?"`` for the closest names to ``name`` in ``known`` (difflib), or ``""``."""
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def check_rule_names(rules: Rules, run: pd.DataFrame, base: pd.DataFrame) -> None:
    """Refuse rules that could never apply, which would leave the looser default in force with no sign: a
    ``[metrics.NAME]`` / ``--tolerance NAME:...`` whose NAME is neither a registered metric
    (:data:`lctx.metrics.METRICS`, lm-eval's names in :data:`OTHER_DIRECTIONS`) nor a metric or ``task.metric``
    of a cell of the run or the baseline; an ``--alias NEW=OLD`` / ``[alias]`` whose NEW is no model of the run.

    Raises:
        LctxError: one line naming the unknown name, near matches and the known names.
    """
    metrics = set(run["metric"]) | set(base["metric"])
    plain = set(METRICS) | set(OTHER_DIRECTIONS) | metrics | {_base_metric(m) for m in metrics}
    scoped = {f"{t}.{m}" for df in (run, base) for t, mm in zip(df["task"], df["metric"])
              for m in (mm, _base_metric(mm))}
    for name in rules.metrics:
        if name in plain or name in scoped:
            continue
        if "." in name:
            task, metric = name.split(".", 1)
            tasks = set(run["task"]) | set(base["task"])
            what = (f"task {task!r} is in neither the run nor the baseline (tasks: {quote(', '.join(sorted(tasks)))})"
                    if task not in tasks else f"task {task!r} has no metric {metric!r} there")
            raise LctxError(f"rule for metric {name!r} would never apply: {what}{_near(name, scoped)}; fix the "
                            "name in --rules / --tolerance")
        raise LctxError(f"unknown metric {name!r} in --rules / --tolerance{_near(name, plain)} (known: "
                        f"{quote(', '.join(sorted(plain)), 600)}; `lctx list metrics`); fix the name")
    models = set(run["model"]) | ({b for b in run["position_base"] if not _blank(b)} if "position_base" in run.columns
                                  else set())
    for new in rules.alias:
        if new not in models:
            raise LctxError(f"--alias {new}={rules.alias[new]}: the run has no model {new!r}{_near(new, models)} "
                            f"(its models: {quote(', '.join(sorted(map(str, models))))}); alias a run model to a baseline model")


def compare_runs(run: pd.DataFrame, base: pd.DataFrame, rules: Rules | None = None,
                 allow_missing: bool = False, allow_option_changes: bool = False,
                 declared: dict | None = None, across_seeds: bool = False) -> Comparison:
    """Match the cells of ``run`` and ``base`` (summary tables, :func:`load_summary`) and judge each one.

    diff = run mean - baseline mean (metric units); rel_diff = diff / |baseline mean|;
    z = diff / sqrt(se_run^2 + se_base^2) (NaN when neither has a standard error). ``options``: the label
    columns that differ between the two sides (:func:`option_differences`); such a cell is ``incomparable``
    unless ``allow_option_changes``, which judges it all the same. ``declared``: {task: metadata} the run
    directories recorded (run.json's ``task_meta``, :func:`lctx.harness.run.rundir.declared_tasks`): the tasks'
    directions and ``uses_seed`` without their task files (:func:`compare_dirs` passes it). ``across_seeds``: the
    two sides were made with different ``--seed`` on purpose (a reproduction check: other samples, the same
    measurement), so a seed that differs does not make a cell incomparable; every other option still does.

    Raises:
        LctxError: no task or no model in common (mismatched runs; the message suggests ``--alias``),
            a metric with no known direction (add it to the rules).
    """
    rules = rules or Rules()
    check_rule_names(rules, run, base)
    run = run.copy()
    run["run_model"] = run["model"]
    bases = run["position_base"] if "position_base" in run.columns else pd.Series("", index=run.index)
    run["model"] = [_aliased(m, b, rules.alias) for m, b in zip(run["model"], bases)]
    common_tasks = set(run["task"]) & set(base["task"])
    if not common_tasks:
        raise LctxError(f"mismatched tasks: the run has {sorted(set(run['task']))} and the baseline "
                        f"{sorted(set(base['task']))}; compare runs of the same tasks")
    if not set(run["model"]) & set(base["model"]):
        rm, bm = sorted(set(run["run_model"])), sorted(set(base["model"]))
        hint = f"--alias {rm[0]}={bm[0]}" if len(rm) == 1 and len(bm) == 1 else "--alias NEW=OLD"
        raise LctxError(f"no model in common: the run has {rm} and the baseline {bm}; "
                        f"if a checkpoint was renamed, pass {hint}")
    labels = [c for c in LABEL_COLUMNS + [POSITION] if c in run.columns and c in base.columns]
    for what, df, ks in (("run", run, ["run_model"] + KEYS[1:] + labels), ("baseline", base, KEYS + labels)):
        if df.duplicated(ks).any():
            r = df[df.duplicated(ks)].iloc[0]
            raise LctxError(f"the {what}'s summary has two rows for cell ({r[ks[0]]}, {r['task']}, {r['metric']}, "
                            f"{_fmt_len(r['length'])}, {r['depth']}) with no option columns to tell them apart; "
                            "rewrite it with lctx run (one model name per checkpoint)")
    shared = run.groupby(KEYS, dropna=False)["run_model"].nunique()
    if (shared > 1).any():
        model = shared[shared > 1].index[0][0]
        raise LctxError(f"two run models map to baseline model {model!r} (check --alias); "
                        "alias at most one run model to each baseline model")
    directions = {}
    for task, metric in set(zip(run["task"], run["metric"])) | set(zip(base["task"], base["metric"])):
        d = rules.direction_for(task, metric, declared)
        if d is None:
            raise LctxError(f"metric {metric!r} of task {task!r} has no known direction; add "
                            f"[metrics.{metric}] direction = \"higher\" (or \"lower\", \"equal\", \"ignore\") to --rules")
        directions[(task, metric)] = d

    rows = []
    for r, b, used in _match_cells(run, base, labels, declared, across_seeds):
        task, metric = (r or b)["task"], (r or b)["metric"]
        direction = directions[(task, metric)]
        tol = rules.tolerance_for(task, metric)
        r_, b_ = r or {}, b or {}
        row = {"model": r_["run_model"] if r else b_["model"], "baseline_model": b_.get("model"),
               "method": r_.get("method") or b_.get("method") or "",
               "unavailable": _unavailable_note(r_, b_),
               "variant": r_.get("variant") if isinstance(r_.get("variant"), str) else b_.get("variant"),
               "task": task, "metric": metric, "length": _int_or_none((r or b)["length"]), "depth": (r or b)["depth"],
               "direction": direction, "base_mean": b_.get("mean", math.nan), "base_stderr": b_.get("stderr", math.nan),
               "base_n": b_.get("n", math.nan), "run_mean": r_.get("mean", math.nan),
               "run_stderr": r_.get("stderr", math.nan), "run_n": r_.get("n", math.nan),
               "run_ci_low": r_.get("ci_low", math.nan), "run_ci_high": r_.get("ci_high", math.nan),
               "base_ci_low": b_.get("ci_low", math.nan), "base_ci_high": b_.get("ci_high", math.nan),
               "run_n_error": r_.get("n_error", math.nan), "base_n_error": b_.get("n_error", math.nan),
               "diff": math.nan, "rel_diff": math.nan, "z": math.nan, "threshold": math.nan, "bound_by": "",
               "options": "", "option_set": r_.get("_set") or b_.get("_set", "")}
        if row["unavailable"]:  # a side could not give the metric: nothing to judge, never a regression
            row["status"] = "unavailable"
        elif b is None:
            row["status"] = "new"
        elif r is None:
            row["status"] = "missing"
        else:
            row["options"] = "; ".join(option_differences({c: r[c] for c in used}, {c: b[c] for c in used}))
            row["status"] = _judge(row, direction, tol)
            if row["options"] and not allow_option_changes and row["status"] != "ignored":
                row["status"] = "incomparable"  # diff and z stay in the table, for the record
        rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    order = {s: i for i, s in enumerate(STATUSES)}
    table = (table.assign(_o=table["status"].map(order))
             .sort_values(["_o", "model", "task", "metric", "length", "depth"], na_position="first")
             .drop(columns="_o").reset_index(drop=True))
    counts = {s: int((table["status"] == s).sum()) for s in STATUSES}
    failed = (any(counts[s] for s in FAILING) or (counts["missing"] > 0 and not allow_missing)
              or counts["incomparable"] > 0)
    return Comparison(table, counts, failed, allow_missing=allow_missing)


def _aliased(model: str, base: object, alias: dict) -> str:
    """``model`` renamed by ``--alias``: its own alias, else, for a positional method's model ``{base}+{label}``
    (``base``: its run.json base name, :func:`with_positions`), the alias of its base with the same suffix, so
    ``--alias new=old`` renames a checkpoint and every method evaluated on it."""
    if model in alias:
        return alias[model]
    b = "" if _blank(base) else str(base)
    if b and b != model and b in alias and str(model).startswith(b + "+"):
        return alias[b] + str(model)[len(b):]
    return model


def _unavailable_note(run: dict, base: dict) -> str:
    """Which side of a cell could not give its metric (summary ``n_unavailable`` > 0, or a reason) and why, e.g.
    ``run: no prompt log-probs``; "" when both sides (those there are) gave every value."""
    parts = {}
    for side, r in (("run", run), ("baseline", base)):
        if r and ((r.get("n_unavailable") or 0) > 0 or r.get("unavailable")):
            parts[side] = str(r.get("unavailable") or "unavailable")
    if len(parts) == 2 and len(set(parts.values())) == 1:  # the same reason on both sides: said once
        return f"both: {parts['run']}"
    return "; ".join(f"{side}: {why}" for side, why in parts.items())


def _match_cells(run: pd.DataFrame, base: pd.DataFrame, labels: list[str], declared: dict | None,
                 across_seeds: bool = False):
    """Pair the run's rows with the baseline's, cell by cell (:data:`KEYS`, the run's model through the aliases):
    yields (run row or None, baseline row or None, the label columns compared), each row a dict with ``_set``
    (:func:`_option_sets`).

    A cell with one option set on each side pairs the two (options that differ make it incomparable). A cell with
    several option sets on a side (one run directory holding two ppl strides) pairs each run set with the baseline
    set of the same options; the sets left over pair with the closest set left on the other side (incomparable)
    when there is one, else they are new (run) or missing (baseline). A cell's pairing reads that cell's rows
    alone: a second option set of another task once switched every cell to matching on the options, so that ppl
    cells made with other options read as 'missing' + 'new' (exit 1) instead of 'not comparable' (exit 2)."""
    runs, bases = _by_cell(run, labels), _by_cell(base, labels)
    for key in list(runs) + [k for k in bases if k not in runs]:
        R, B = runs.get(key, []), bases.get(key, [])
        used = [c for c in labels if c != "seed" or (not across_seeds and _task_uses_seed(key[1], declared))]
        pairs, left_r, left_b = [], list(range(len(R))), list(range(len(B)))
        if R and B:
            ndiff = {(i, j): len(option_differences({c: R[i][c] for c in used}, {c: B[j][c] for c in used}))
                     for i in left_r for j in left_b}
            # the same options: recorded alike first, then alike where both record them
            for same in (lambda i, j: all(R[i][c] == B[j][c] for c in used), lambda i, j: ndiff[i, j] == 0):
                for i in list(left_r):
                    j = next((j for j in left_b if same(i, j)), None)
                    if j is not None:
                        pairs.append((i, j))
                        left_r.remove(i)
                        left_b.remove(j)
            if left_r and left_b:  # other options on both sides: each set against the closest of the other side
                pairs += [(i, min(left_b, key=lambda j: ndiff[i, j])) for i in left_r]
                paired = {j for _, j in pairs}
                pairs += [(min(left_r, key=lambda i: ndiff[i, j]), j) for j in left_b if j not in paired]
                left_r, left_b = [], []
        yield from ((R[i], B[j], used) for i, j in pairs)
        yield from ((R[i], None, used) for i in left_r)
        yield from ((None, B[j], used) for j in left_b)


def _by_cell(df: pd.DataFrame, labels: list[str]) -> dict[tuple, list[dict]]:
    """{(model, task, metric, length, depth): its rows}, a NaN length or depth as None (NaN != NaN); each row's
    ``_set`` says what tells it from the cell's other rows (:func:`_option_sets`)."""
    cells: dict[tuple, list[dict]] = {}
    for r in df.to_dict("records"):
        key = (r["model"], r["task"], r["metric"], _int_or_none(r["length"]),
               None if r["depth"] != r["depth"] else float(r["depth"]))
        cells.setdefault(key, []).append(r)
    for rows in cells.values():
        for r, s in zip(rows, _option_sets(rows, labels)):
            r["_set"] = s
    return cells


def _option_sets(rows: list[dict], labels: list[str]) -> list[str]:
    """For the rows of one cell (one side), the options that tell them apart, one string per row
    (``"key_digits=3"``; ``""`` for a cell of one row): a run holding two option sets shows two rows per cell
    that would otherwise look the same."""
    if len(rows) < 2:
        return [""] * len(rows)
    sets = []
    for r in rows:
        opts = {}
        for c in labels:
            v = r.get(c)
            if c == "task_options" and not _blank(v):
                try:
                    j = json.loads(v)
                except (TypeError, ValueError):
                    j = None
                if isinstance(j, dict):
                    opts.update({k: _show_option(k, x) for k, x in j.items()})
                    continue
            opts[c] = "-" if _blank(v) else str(v)
        sets.append(opts)
    names = list(dict.fromkeys(k for o in sets for k in o))
    differ = [k for k in names if len({o.get(k, "-") for o in sets}) > 1]
    return [", ".join(f"{k}={o.get(k, '-')}" for k in differ) for o in sets]


def _show_option(key: str, v) -> str:
    if key == "data" and v:
        return ",".join(_option_value(key, v))
    return v if isinstance(v, str) else json.dumps(v)


def _option_value(key: str, v):
    """An option's value as compared: ``data`` (paths of text files) by file name, since the same corpus sits at
    other absolute paths on other machines; numbers as floats (a seed 0 read back as 0.0)."""
    if key == "data" and v:
        return sorted(posixpath.basename(str(p).rstrip("/")) for p in (v if isinstance(v, list) else [v]))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return v


def option_differences(run: dict, base: dict) -> list[str]:
    """The options that differ between a run's cell and the baseline's: ``["max_tokens: run 32768, baseline
    2048", "dtype: run bfloat16, baseline float32"]``. ``run``/``base`` map label columns (:data:`LABEL_COLUMNS`)
    to their values; ``task_options`` (JSON) is compared key by key. A value one side does not record (blank,
    or a task option an older lctx did not write) cannot be compared and is not listed."""
    out = []
    for col in LABEL_COLUMNS + [POSITION]:
        a, b = run.get(col), base.get(col)
        if _blank(a) or _blank(b):
            continue
        if col == POSITION:  # a model's positional method: named as --position writes it
            if a != b:
                ja, jb = json.loads(a), json.loads(b)
                out.append(f"position: run {_position_text(ja)}, baseline {_position_text(jb)}")
            continue
        if col == "task_options":
            try:
                ja, jb = json.loads(a), json.loads(b)
            except (TypeError, ValueError):
                ja, jb = a, b
            if isinstance(ja, dict) and isinstance(jb, dict):
                for k in sorted(set(ja) & set(jb)):
                    if _option_value(k, ja[k]) != _option_value(k, jb[k]):
                        out.append(f"{k}: run {json.dumps(ja[k])}, baseline {json.dumps(jb[k])}")
                continue
        else:
            try:
                ja, jb = float(a), float(b)
            except (TypeError, ValueError):
                ja, jb = str(a).strip(), str(b).strip()
        if ja != jb:
            out.append(f"{col}: run {a}, baseline {b}")
    return out


def _int_or_none(v):
    try:
        return None if v is None or math.isnan(float(v)) else int(v)
    except (TypeError, ValueError):
        return None


def _fmt_len(v) -> str:
    v = _int_or_none(v)
    return "" if v is None else str(v)


def rule_interval(row: dict) -> tuple[float, float]:
    """The run's 95 % interval as the ``interval`` rule tests it: summary.csv's ``ci_low``, ``ci_high``, except for
    a degenerate cell, a t interval of zero width (every sample the same value: two digit_acc of 0.6), whose sample
    variance 0 says nothing about the spread. There the rule uses the widest spread the metric's range allows:
    a variable in [a, c] with mean m has variance <= (c - m)(m - a) (Bhatia and Davis 2000, "A better bound on the
    variance", Amer. Math. Monthly 107), a Bernoulli's with that mean, so the floor is the Wilson interval of
    (m - a) / (c - a) over the cell's n, mapped back to [a, c] (two samples at 0.6 of [0, 1]: [0.13, 0.94], intervals.wilson(1.2, 2)). A metric
    without a registered range (ppl) gets no interval there (NaN, NaN): the thresholds alone judge it, as a
    cell of one sample. Returns (low, high) in metric units, NaN where the rule has none.

    Source: a new user's trial (a zero-width interval let ``--across-seeds`` call noise an improvement).
    """
    from lctx.harness.run.intervals import wilson  # lazy: a leaf module (scipy only for t quantiles)
    from lctx.metrics import bounds_of  # lazy: a leaf module

    lo, hi = row.get("run_ci_low", math.nan), row.get("run_ci_high", math.nan)
    m, n = row.get("run_mean", math.nan), _int_or_none(row.get("run_n"))
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(m)) or hi - lo > 1e-12 * max(1.0, abs(m)):
        return lo, hi
    bounds = bounds_of(str(row.get("metric", "")))
    if not n or not bounds or not all(math.isfinite(float(x)) for x in bounds) or not bounds[0] <= m <= bounds[1] \
            or bounds[1] <= bounds[0]:
        return math.nan, math.nan
    a, c = (float(x) for x in bounds)
    w_lo, w_hi = wilson((m - a) / (c - a) * n, n)
    return a + w_lo * (c - a), a + w_hi * (c - a)


def _judge(row: dict, direction: str, tol: Tolerance) -> str:
    """Status of one matched cell; fills diff, rel_diff, z, threshold and bound_by in ``row``."""
    b, r = row["base_mean"], row["run_mean"]
    if direction == "ignore":
        return "ignored"
    b_ok, r_ok = math.isfinite(b), math.isfinite(r)
    # samples that failed now but not in the baseline are a regression whatever the mean of the rest says
    if (not r_ok and b_ok) or (row["run_n_error"] or 0) > (row["base_n_error"] or 0):
        return "error"
    if not r_ok and not b_ok:  # nothing scored on either side: errors in the run are never "same" (a gate that
        return "error" if (row["run_n_error"] or 0) > 0 else "same"  # passes an all-error run against an all-error baseline)
    if not b_ok:  # the baseline's samples failed, the run's did not
        return "improvement"
    diff = r - b
    se_b = row["base_stderr"] if math.isfinite(row["base_stderr"]) else 0.0
    se_r = row["run_stderr"] if math.isfinite(row["run_stderr"]) else 0.0
    se = math.sqrt(se_b**2 + se_r**2)
    row["diff"] = diff
    row["rel_diff"] = diff / abs(b) if b != 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    row["z"] = diff / se if se > 0 else math.nan
    row["threshold"], row["bound_by"] = tol.threshold(b, se)
    if abs(diff) <= row["threshold"]:
        return "same"
    lo, hi = rule_interval(row)
    if tol.interval and math.isfinite(lo) and math.isfinite(hi) and lo <= b <= hi:
        row["bound_by"] = "interval"  # beyond the thresholds, but the baseline lies inside the run's interval
        return "same"
    if direction == "equal":
        return "regression"
    better = diff > 0 if direction == "higher" else diff < 0
    return "improvement" if better else "regression"


# ---------------------------------------------------------------------------------------------- output

def _fmt(v, se=None, lo=None, hi=None) -> str:
    """``mean [lo, hi]`` (the 95 % interval, where the summary has one), else ``mean ± se``, else ``mean``."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    s = f"{v:.4g}"
    if isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi):
        return s + f" [{lo:.3g}, {hi:.3g}]"
    if se is not None and isinstance(se, float) and math.isfinite(se) and se > 0:
        s += f" ± {se:.2g}"
    return s


def long_reasons(cmp: Comparison, include_same: bool = False) -> list[str]:
    """The distinct ``unavailable`` notes of the shown cells (all of them with ``include_same``) longer than
    :data:`lctx.harness.run.tables.SHORT_REASON` characters, in table order: each is printed once above the table
    (capped) and its cells' notes name it as ``reason [k]``, instead of a 400-character reason in every row."""
    t = cmp.table if include_same else cmp.table[~cmp.table["status"].isin(["same", "ignored"])]
    notes = [r for r in t.loc[t["status"] == "unavailable", "unavailable"] if isinstance(r, str)]
    return [r for r in dict.fromkeys(notes) if len(r) > SHORT_REASON]


def _reason_lines(cmp: Comparison) -> list[str]:
    """The lines above the table: ``unavailable [k]: reason`` per :func:`long_reasons`, capped."""
    return [f"unavailable [{k}]: {quote(why)}" for k, why in enumerate(long_reasons(cmp), 1)]


def _display_rows(cmp: Comparison, include_same: bool = False) -> list[list[str]]:
    t = cmp.table if include_same else cmp.table[~cmp.table["status"].isin(["same", "ignored"])]
    ref = {why: k for k, why in enumerate(long_reasons(cmp, include_same), 1)}
    out = []
    for r in t.itertuples(index=False):
        model = r.model if not isinstance(r.baseline_model, str) or r.baseline_model == r.model \
            else f"{r.model} (= {r.baseline_model})"
        rel = f"{100 * r.rel_diff:+.3g}%" if math.isfinite(r.rel_diff) and abs(r.rel_diff) < 1e6 else ""
        tol = f"{r.threshold:.3g} ({r.bound_by})" if math.isfinite(r.threshold) else ""
        note = (f"{'not comparable' if r.status == 'incomparable' else 'options differ'}: {r.options}"
                if isinstance(r.options, str) and r.options else "")
        if r.status == "unavailable":
            note = (f"not comparable (unavailable [{ref[r.unavailable]}], above the table)" if r.unavailable in ref
                    else f"not comparable (unavailable: {quote(r.unavailable)})")
        if isinstance(r.option_set, str) and r.option_set:  # a run or baseline of several option sets: which one
            note = f"[{r.option_set}] {note}".rstrip()
        out.append([r.status, model] + ([r.method if isinstance(r.method, str) else ""] if shows_method(cmp) else [])
                   + [r.task, r.metric, _fmt_len(r.length), "" if r.depth != r.depth else f"{r.depth:g}",
                    r.direction, _fmt(r.base_mean, r.base_stderr, r.base_ci_low, r.base_ci_high),
                    _fmt(r.run_mean, r.run_stderr, r.run_ci_low, r.run_ci_high),
                    _fmt(r.diff), rel, tol, note])
    return out


DISPLAY_HEADER = ["status", "model", "task", "metric", "length", "depth", "better", "baseline", "run", "diff",
                  "rel", "tolerance", "note"]


def shows_method(cmp: Comparison) -> bool:
    """Whether the printed table has a ``method`` column: some cell's model has a positional method recorded in its
    run.json (:func:`with_positions`)."""
    return "method" in cmp.table.columns and cmp.table["method"].fillna("").astype(str).str.strip().ne("").any()


def display_header(cmp: Comparison) -> list[str]:
    """The printed table's header: :data:`DISPLAY_HEADER`, with ``method`` after ``model`` when :func:`shows_method`."""
    return DISPLAY_HEADER[:2] + ["method"] + DISPLAY_HEADER[2:] if shows_method(cmp) else list(DISPLAY_HEADER)


def verdict(cmp: Comparison) -> str:
    """One line: PASS/FAIL and the count of each status."""
    c = cmp.counts
    word = "FAIL" if cmp.failed else "PASS"
    return (f"{word}: {c['regression']} regressed, {c['error']} errored, {c['missing']} missing, "
            f"{c['incomparable']} not comparable (options differ), "
            + (f"{c['unavailable']} not comparable (unavailable), " if c.get("unavailable") else "")
            + f"{c['improvement']} improved, {c['new']} new, {c['same']} within tolerance")


def print_report(cmp: Comparison, file=None) -> None:
    """Print the non-'same' cells as a table (rich on a terminal, Markdown off one: every cell whole, see
    :mod:`lctx.harness.run.console`; a number, ``61.7 ± 2`` or a tolerance ``6e-05 (abs)``, never wraps: a table
    too wide for the terminal drops its empty columns or prints as Markdown), then the verdict line."""

    rows = _display_rows(cmp)
    for line in _reason_lines(cmp):  # a long reason once, above the table
        print_line(line, file=file)
    if rows:
        style = {"regression": "bold red", "error": "bold red", "incomparable": "bold yellow", "missing": "yellow",
                 "improvement": "green", "new": "cyan", "unavailable": "dim"}
        print_table(display_header(cmp), rows, title=f"lctx compare: {cmp.run_dir} vs baseline {cmp.baseline_dir}",
                    right=("length", "depth", "baseline", "run", "diff", "rel"),
                    no_wrap=("length", "depth", "baseline", "run", "diff", "rel", "tolerance"),
                    row_styles=[style.get(r[0]) for r in rows], file=file)
    print_line(verdict(cmp), style="bold red" if cmp.failed else "bold green", file=file)


def write_report(cmp: Comparison, out_dir: Path) -> tuple[Path, Path]:
    """Write ``compare.csv`` (every cell, all columns) and ``compare.md`` (verdict + the non-'same' cells).

    Raises:
        LctxError: ``out_dir`` cannot be created or written.
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        csv = out_dir / "compare.csv"
        clean_frame(cmp.table, escape=True).to_csv(csv, index=False)
        md = out_dir / "compare.md"
        lines = ["# lctx compare", "", f"- run: `{cmp.run_dir}`", f"- baseline: `{cmp.baseline_dir}`", "",
                 f"**{verdict(cmp)}**", ""]
        rows = _display_rows(cmp)
        lines += [f"- {line}" for line in _reason_lines(cmp)] + ([""] if _reason_lines(cmp) else [])
        if rows:
            header = display_header(cmp)
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
        else:
            lines.append("Every matched cell is within tolerance.")
        md.write_text(safe("\n".join(lines) + "\n"))  # redacted, control characters escaped
    except OSError as e:
        raise LctxError(f"cannot write to --out {str(out_dir)!r} ({e.strerror or e}); pass a writable directory") from None
    return csv, md


def compare_dirs(run_dir: Path, baseline_dir: Path, rules: Rules | None = None,
                 allow_missing: bool = False, allow_option_changes: bool = False,
                 across_seeds: bool = False) -> Comparison:
    """:func:`compare_runs` on two run directories (see :func:`load_summary` for what is read). Where a run.json records
    positional methods, both summaries get each model's method (:func:`with_positions`): a method's model
    (``{base}+{label}``) pairs with the same (base, method) of the baseline by its name, as any model does (a method
    the run lacks is ``missing``), the printed table names the method, and a model whose method or options differ
    between the two sides is ``incomparable`` (:func:`option_differences`).

    Raises:
        LctxError: as :func:`load_summary` and :func:`compare_runs`.
    """
    run = load_summary(run_dir, "run")
    base = load_summary(baseline_dir, "baseline")
    declared: dict = {}
    metas: dict = {}
    for d in (baseline_dir, run_dir):  # the run's declaration of a task over the baseline's
        # the verdict reads the summaries and the tasks' declared directions (a baseline may be summary.csv alone),
        # so a damaged run.json does not stop the gate; it is named all the same, never passed over without a word
        try:
            metas[d] = read_json(Path(d) / "run.json") or {}
            declared.update(declared_tasks(metas[d]))
        except LctxError as e:
            say(f"warning: {e}; lctx compare does not read it (the verdict stands)", err=True)
    if any(run_positions(m) for m in metas.values()):  # positional methods: named, and compared as options
        run, base = with_positions(run, metas.get(run_dir)), with_positions(base, metas.get(baseline_dir))
    cmp = compare_runs(run, base, rules, allow_missing, allow_option_changes, declared, across_seeds)
    cmp.run_dir, cmp.baseline_dir = str(run_dir), str(baseline_dir)
    return cmp
