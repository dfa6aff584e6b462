"""MMLU and ARC through lm-eval's evaluator, written into lctx's tidy results table.

``mmlu`` (Hendrycks et al. 2021; 57 subjects, 5-shot by default, metric ``acc``), ``arc_easy`` and
``arc_challenge`` (Clark et al. 2018, AI2 Reasoning Challenge; 0-shot by default, metrics ``acc`` and
``acc_norm``) run through ``lm_eval.simple_evaluate`` with lm-eval's own task definitions (prompt,
choices, target, metrics): MMLU as lm-eval's ``mmlu/default`` (subject description line, question,
``A.``..``D.`` choices, ``Answer:``, few-shot = the first k ``dev`` questions), ARC as lm-eval's
``arc_easy``/``arc_challenge`` (``Question: ...\\nAnswer:``, each choice text scored as a continuation).

Data:

- with a data directory (``lctx run --data-dir DIR`` / ``LCTX_DATA_DIR``), lctx writes task configs
  that ``include`` lm-eval's YAML and replace only the data: a ``custom_dataset`` hook
  (:func:`local_dataset`) that reads the original layouts, ``DIR/mmlu/{dev,test}/<subject>_{dev,test}.csv``
  (hendrycks/test CSVs, no header, columns question, A, B, C, D, answer letter) and
  ``DIR/arc/ARC-{Easy,Challenge}-{Test,Dev}.jsonl`` (ARC-V1-Feb2018 JSONL), into the Hugging Face
  layouts the lm-eval templates expect (``cais/mmlu``, ``allenai/ai2_arc``). The configs go to a
  temporary directory loaded with ``TaskManager(include_path=..., include_defaults=False)``.
  ARC's local copy has no train split, so an ARC few-shot context (``--num-fewshot`` > 0) is drawn from
  the Dev split (lm-eval's hub config draws it from train).
- without one, lm-eval's built-in tasks load ``cais/mmlu`` and ``allenai/ai2_arc`` from the hub.

Models: one bridge (:class:`LmEvalBridge`, made per model by :meth:`LmEvalSuite.bridge`) turns any model adapter into
the lm-eval model ``simple_evaluate`` runs, chosen by the adapter's capabilities
(:func:`lctx.models.adapters.protocol.capabilities`, its ``lmeval``), never by its backend: ``"protocol"`` (any adapter:
:func:`adapter_lmeval_class`, lm-eval's requests scored through ``prefix`` + ``score_continuation``, so a new backend
runs mmlu/arc with nothing added here), or one of two faster engines an adapter may offer, ``"hf"`` and ``"api"``
(:data:`LMEVAL_BRIDGES`). ``"hf"``: an adapter with ``lmeval_model()`` (:class:`lctx.models.adapters.hf.HFAdapter`,
native lctx or Hugging Face checkpoint, already loaded by ``load_lm``) is wrapped in :class:`LctxHFLM`, lm-eval's
``hf`` backend (``HFLM``) with two changes:
native lctx models get the BOS token their training always put first (their tokenizer does not add
it; Hugging Face models keep lm-eval's default, whatever ``tokenizer.encode`` adds), and logits are computed
only at the continuation positions lm-eval scores, in row blocks (:func:`lctx_hflm_class`). ``LctxHFLM`` is
registered in lm-eval's model registry as ``"lctx"``, so
``lm_eval.simple_evaluate(model="lctx", model_args={"pretrained": "ckpt/rope-256"})`` works too.
``"api"``: an adapter with ``lmeval_api_model()`` (a served model, :class:`lctx.models.adapters.server.ServerAdapter`,
``--model http://HOST:PORT/v1``) is wrapped in :func:`served_lmeval_class`'s ``LctxCompletionsLM``, lm-eval's ``local-completions`` model
(``LocalCompletionsAPI``) with the adapter's tokenizer and requests; its log-likelihoods are echoed prompt
log-probabilities, so they run only after the server passed lctx's trust probe, and otherwise every metric of every
question is recorded as unavailable with the probe's reason (never 0). The lm-eval batch memory check does not run for
it (its memory is the server's); its requests go ``--concurrency`` at a time.

Records: one per question (``sample`` = lm-eval ``doc_id``, ``length``/``depth`` empty), metrics
``acc`` (and ``acc_norm``) as 0/1, so ``summary.csv``'s mean, stderr (sample std / sqrt(n), lm-eval's
``mean_stderr``) and n are lm-eval's accuracy, standard error and question count. MMLU records all
have task ``mmlu`` with the subject in ``task_options`` (``summary.csv``'s ``mmlu`` row is the mean over
questions, lm-eval's size-weighted MMLU aggregate); the per-subject breakdown is written to
``mmlu_subjects.csv``. ``extra`` holds the predicted and gold answer (letter / ARC label) per question.
A rerun into the same ``--out`` skips questions already recorded (resumable per subject).
"""

from __future__ import annotations

import array
import contextlib
import csv
import hashlib
import importlib.util
import json
import logging
import math
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lctx.chat import render_chat
from lctx.defaults import LMEVAL_BATCH_SIZE
from lctx.errors import LctxError, MetricUnavailable, check_finite_logits

from .base import Cell, RunOption, Sample, Task, TaskFamily, TaskGroup, register_group

#: lctx name -> metrics it reports
METRICS = {"mmlu": ("acc",), "arc_easy": ("acc", "acc_norm"), "arc_challenge": ("acc", "acc_norm")}
#: few-shot examples when ``--num-fewshot`` is not given (MMLU paper: 5-shot; lm-eval's ARC: 0-shot)
DEFAULT_FEWSHOT = {"mmlu": 5, "arc_easy": 0, "arc_challenge": 0}
#: ARC task -> (test file, dev file) under ``DATA_DIR/arc`` (ARC-V1-Feb2018 names)
ARC_FILES = {"arc_easy": ("ARC-Easy-Test.jsonl", "ARC-Easy-Dev.jsonl"),
             "arc_challenge": ("ARC-Challenge-Test.jsonl", "ARC-Challenge-Dev.jsonl")}
MMLU_CATEGORIES = ("stem", "humanities", "social_sciences", "other")
DESCRIPTION = {"mmlu": "MMLU through lm-eval (57 subjects, 5-shot; or mmlu_<subject>, mmlu_<category>)",
               "arc_easy": "ARC-Easy through lm-eval (0-shot)",
               "arc_challenge": "ARC-Challenge through lm-eval (0-shot)"}
#: the data each task reads (for ``lctx list tasks``)
REQUIRES = {"mmlu": "mmlu/{dev,test}/ (else the hub: cais/mmlu)",
            "arc_easy": "arc/ARC-Easy-*.jsonl (else the hub: allenai/ai2_arc)",
            "arc_challenge": "arc/ARC-Challenge-*.jsonl (else the hub: allenai/ai2_arc)"}


class LmEvalFamily(TaskFamily):
    """lm-eval's tasks as the runner builds them (:class:`lctx.tasks.TaskFamily`): the run's ``mmlu`` /
    ``mmlu_<subject>`` / ``arc_*`` names become :class:`LmEvalTask` s sharing one :class:`LmEvalSuite`
    (:func:`build_tasks`), with ``--limit`` and ``--num-fewshot``; not sharded across processes; its summary text
    is ``reports["lmeval"]`` (:func:`lctx.harness.steps.lmeval_run.format_summary`)."""

    name = "lmeval"
    shardable = False
    #: nothing beyond the protocol: every adapter runs lm-eval through the one bridge (LmEvalBridge; lmeval_model /
    #: lmeval_api_model, lctx.models.adapters.protocol.LMEVAL_CAPABILITIES, only give it a faster engine)
    adapter_needs: dict = {}
    run_options = (RunOption("--limit", "limit", None, None, "a positive number of questions, e.g. --limit 20",
                             users="mmlu/arc_*"),
                   RunOption("--num-fewshot", "num_fewshot", None, None, "0 or more", users="mmlu/arc_*"))

    def check_settings(self, values: dict) -> None:
        """:func:`check_settings` of ``values["limit"]`` and ``values["num_fewshot"]``.

        Raises:
            LctxError: a bad limit or few-shot count.
        """
        check_settings(values.get("limit"), values.get("num_fewshot"))

    def check_data(self, names: list[str], data_dir) -> None:
        """Without ``--data-dir`` the tasks read the Hugging Face hub: offline and not cached, refuse them now
        (:func:`check_hub`), not after lm-eval's retries.

        Raises:
            LctxError: the hub is unreachable and a task's dataset is not in the local cache.
        """
        if data_dir is None:
            check_hub(resolve_tasks(names, None)[0])

    def build(self, names: list[str], values: dict, *, data_dir=None, seed: int = 0, batch_size: int = LMEVAL_BATCH_SIZE,
              chat_template: bool = False, system_prompt: str | None = None, log=None) -> list[Task]:
        """:func:`build_tasks` with the run's ``--limit`` / ``--num-fewshot`` (``values``).

        Raises:
            LctxError: a bad setting, an unknown name or missing local data.
        """
        return build_tasks(names, data_dir, limit=values.get("limit"), num_fewshot=values.get("num_fewshot"),
                           seed=seed, batch_size=batch_size, chat_template=chat_template,
                           system_prompt=system_prompt, log=log)

    def owns_label(self, label: str) -> bool:
        """:func:`is_lmeval_label`."""
        return is_lmeval_label(label)


#: the lm-eval family: builds the task objects of every lm-eval name of a run
LMEVAL = LmEvalFamily()


class LmEvalGroup(TaskGroup):
    """An lm-eval task name (``arc_easy``, ``arc_challenge``; :class:`MmluGroup` for ``mmlu``) as the runner knows it
    (:class:`lctx.tasks.TaskGroup`): built by :data:`LMEVAL`, a benchmark of the report's accuracy bars."""


class MmluGroup(LmEvalGroup):
    """``mmlu``: also runs ``mmlu_<subject>`` and ``mmlu_<category>``; its subjects are pooled into one cell named by
    what they are (:func:`pooled_label`), and broken down in ``mmlu_subjects.csv`` (:func:`mmlu_subject_table`)."""

    def claims(self, name: str) -> bool:
        """``mmlu``, ``mmlu_<subject>``, ``mmlu_<category>`` (:func:`is_lmeval_task`)."""
        return name == self.name or (name.startswith(self.name + "_") and is_lmeval_task(name))

    def owns_label(self, label: str) -> bool:
        """``mmlu`` and the labels of :func:`pooled_label` (``mmlu_astronomy``, ``mmlu (3 subjects)``)."""
        return label == self.name or label.startswith((self.name + "_", self.name + " ("))

    def pooled_label(self, subtasks) -> str:
        """:func:`pooled_label` of the subjects."""
        return pooled_label(self.name, subtasks)

    def extra_tables(self, table) -> dict:
        """``mmlu_subjects.csv`` (:func:`mmlu_subject_table`) when the table has MMLU rows."""
        subj = mmlu_subject_table(table)
        return {"mmlu_subjects.csv": subj} if len(subj) else {}


for _name in DESCRIPTION:  # listed by `lctx list tasks` (their task objects are made per run: LmEvalTask)
    register_group((MmluGroup if _name == "mmlu" else LmEvalGroup)(
        _name, DESCRIPTION[_name], METRICS[_name], REQUIRES[_name], family=LMEVAL, benchmark=0 if _name == "mmlu" else 1))


def _lm_eval_dir() -> Path:
    """Folder of the installed ``lm_eval`` package, found without importing it (that takes seconds)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise LctxError("lm-eval is not installed; `pip install lm-eval` (lctx depends on it) to run mmlu/arc")
    return Path(list(spec.submodule_search_locations)[0])


def mmlu_subjects() -> dict[str, str]:
    """The 57 MMLU subjects and their category (stem, humanities, social_sciences, other), read from
    lm-eval's ``tasks/mmlu/default/mmlu_<subject>.yaml`` files (their ``tag`` is ``mmlu_<category>_tasks``)."""
    out = {}
    for p in sorted((_lm_eval_dir() / "tasks" / "mmlu" / "default").glob("mmlu_*.yaml")):
        subject, cat = p.stem[len("mmlu_"):], "other"
        for line in p.read_text().splitlines():
            if line.strip().strip('"').startswith("tag"):
                cat = line.split(":", 1)[1].strip().strip('"')[len("mmlu_"):-len("_tasks")]
        out[subject] = cat
    return out


def is_lmeval_task(name: str) -> bool:
    """True for the names this module runs: ``mmlu``, ``arc_easy``, ``arc_challenge``, ``mmlu_<subject>``
    and ``mmlu_<category>`` (stem, humanities, social_sciences, other)."""
    if name in METRICS:
        return True
    if name.startswith("mmlu_"):
        rest = name[len("mmlu_"):]
        return rest in MMLU_CATEGORIES or rest in mmlu_subjects()
    return False


def pooled_label(task: str, subjects) -> str:
    """The name a summary row of ``task`` pooled over MMLU ``subjects`` is shown under (``summary.csv``, the
    printed table): the name that runs exactly those subjects, as the user gives it in ``--tasks``:
    ``mmlu_astronomy`` for one subject, ``mmlu_stem`` for exactly a category's subjects, ``mmlu`` for all 57,
    else ``mmlu (N subjects)``. A function of the records alone, so a resumed run keeps its label. ``task``
    itself for any other task (or no subjects)."""
    subs = sorted({str(s) for s in subjects or () if s is not None and s == s})
    if task != "mmlu" or not subs:
        return task
    if len(subs) == 1:
        return f"mmlu_{subs[0]}"
    known = mmlu_subjects()
    if set(subs) == set(known):
        return "mmlu"
    cat = next((c for c in MMLU_CATEGORIES if set(subs) == {s for s, k in known.items() if k == c}), None)
    return f"mmlu_{cat}" if cat else f"mmlu ({len(subs)} subjects)"


def is_lmeval_label(name: str) -> bool:
    """True for a summary row's task that is an lm-eval task's (:func:`pooled_label`'s names included)."""
    name = str(name)
    return name in METRICS or name.startswith("mmlu_") or name.startswith("mmlu (")


# -- reading the original layouts ---------------------------------------------------------------------
def read_arc(path: str | Path) -> list[dict]:
    """Read an ARC-V1-Feb2018 JSONL file (``{"id", "question": {"stem", "choices": [{"text", "label"}]},
    "answerKey"}`` per line) into the Hugging Face ``allenai/ai2_arc`` layout (``{"id", "question",
    "choices": {"text": [...], "label": [...]}, "answerKey"}``), order and labels kept as given.

    Labels may be letters (``A``..``E``) or digits (``1``..``4``); lm-eval's target is
    ``choices.label.index(answerKey)``, so each record's answerKey must be one of its labels.

    Raises:
        LctxError: the file is missing or a line is not such a record, has duplicate labels, or an
            answerKey that is not among its labels (names the file and line).
    """
    p = Path(path)
    if not p.is_file():
        raise LctxError(f"ARC file {str(p)!r} not found; point --data-dir at a folder with "
                        "arc/ARC-{Easy,Challenge}-{Test,Dev}.jsonl (e.g. ../shared/data; `lctx data --out DIR --only arc`)")
    out = []
    with open(p, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                q = r["question"]
                texts = [str(c["text"]) for c in q["choices"]]
                labels = [str(c["label"]) for c in q["choices"]]
                rec = {"id": str(r["id"]), "question": str(q["stem"]), "choices": {"text": texts, "label": labels},
                       "answerKey": str(r["answerKey"]).strip()}
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise LctxError(f"{p}:{i} is not an ARC-V1 record ({type(e).__name__}: {e}); expected "
                                '{"id", "question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}') from None
            if len(set(labels)) != len(labels) or rec["answerKey"] not in labels:
                raise LctxError(f"{p}:{i}: answerKey {rec['answerKey']!r} is not exactly one of the labels "
                                f"{labels}; fix or remove the record")
            out.append(rec)
    return out


def read_mmlu_csv(path: str | Path, subject: str) -> list[dict]:
    """Read a hendrycks/test MMLU CSV (no header; question, A, B, C, D, answer letter) into the Hugging
    Face ``cais/mmlu`` layout (``{"question", "subject", "choices": [4 strings], "answer": 0..3}``).

    Read with Python's ``csv`` module, so every field stays the exact string in the file (no number or
    "None"/"NA" conversion).

    Raises:
        LctxError: the file is missing, a row does not have six fields, or the answer is not A-D.
    """
    p = Path(path)
    if not p.is_file():
        raise LctxError(f"MMLU file {str(p)!r} not found; point --data-dir at a folder with "
                        "mmlu/{dev,test}/<subject>_{dev,test}.csv (e.g. ../shared/data; `lctx data --out DIR --only mmlu`)")
    out = []
    with open(p, encoding="utf-8", newline="") as f:
        for i, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            if len(row) != 6 or row[5].strip() not in ("A", "B", "C", "D"):
                raise LctxError(f"{p}:{i} is not an MMLU row (question, A, B, C, D, answer letter A-D without "
                                "a header); use the original hendrycks/test CSV layout")
            out.append({"question": row[0], "subject": subject, "choices": row[1:5],
                        "answer": "ABCD".index(row[5].strip())})
    return out


def local_dataset(kind: str, path: str, subject: str | None = None, **_ignored):
    """lm-eval ``custom_dataset`` hook: a ``datasets.DatasetDict`` read from the original files.

    kind ``"mmlu"``: ``path`` is the ``mmlu`` folder; splits ``test`` and ``dev`` of ``subject``.
    kind ``"arc_easy"`` / ``"arc_challenge"``: ``path`` is the ``arc`` folder; splits ``test`` and
    ``validation`` (the Dev file). Extra keyword arguments (lm-eval passes the task metadata) are ignored.

    Raises:
        LctxError: unknown kind or a file problem (see :func:`read_arc`, :func:`read_mmlu_csv`).
    """
    import datasets  # lazy: loads datasets

    root = Path(path)
    if kind == "mmlu":
        splits = {s: read_mmlu_csv(root / s / f"{subject}_{s}.csv", subject) for s in ("test", "dev")}
    elif kind in ARC_FILES:
        test, dev = ARC_FILES[kind]
        splits = {"test": read_arc(root / test), "validation": read_arc(root / dev)}
    else:
        raise LctxError(f"unknown local dataset kind {kind!r}; use mmlu, arc_easy or arc_challenge")
    return datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})


# -- task specs and generated configs -------------------------------------------------------------------
@dataclass(frozen=True)
class LmEvalSpec:
    """One lm-eval task to run: ``task`` is the lctx name in the results table (``mmlu``, ``arc_easy``,
    ``arc_challenge``), ``subject`` the MMLU subject (``None`` for ARC), ``lmeval_name`` the lm-eval task
    name (``lctx_mmlu_<subject>`` etc. for local data, the built-in name for the hub)."""

    task: str
    subject: str | None
    lmeval_name: str


def resolve_tasks(names: list[str], data_dir: str | Path | None) -> tuple[list[LmEvalSpec], str]:
    """Expand task names (``mmlu``, ``mmlu_<subject>``, ``mmlu_<category>``, ``arc_easy``,
    ``arc_challenge``) into :class:`LmEvalSpec` s and check the data is there, before any model loads.

    Returns (specs, source) with source ``"local"`` (``data_dir`` given) or ``"hub"``.

    Raises:
        LctxError: an unknown name, or ``data_dir`` lacks the ``mmlu``/``arc`` files a task needs.
    """
    subjects = mmlu_subjects()
    local = data_dir is not None
    specs: list[LmEvalSpec] = []
    for name in names:
        if name == "mmlu":
            subs = list(subjects)
        elif name.startswith("mmlu_") and name[5:] in MMLU_CATEGORIES:
            subs = [s for s, c in subjects.items() if c == name[5:]]
        elif name.startswith("mmlu_") and name[5:] in subjects:
            subs = [name[5:]]
        elif name in ARC_FILES:
            specs.append(LmEvalSpec(name, None, f"lctx_{name}" if local else name))
            continue
        else:
            raise LctxError(f"unknown lm-eval task {name!r}; use mmlu, mmlu_<subject>, mmlu_<category>, "
                            "arc_easy or arc_challenge")
        specs += [LmEvalSpec("mmlu", s, f"lctx_mmlu_{s}" if local else f"mmlu_{s}") for s in subs]
    specs = list(dict.fromkeys(specs))  # keep order, drop repeats (mmlu + mmlu_anatomy)
    if local:
        root = Path(data_dir)
        for sp in specs:
            need = spec_files(sp, root)
            layout = ("mmlu/{dev,test}/<subject>_{dev,test}.csv" if sp.task == "mmlu"
                      else "arc/ARC-{Easy,Challenge}-{Test,Dev}.jsonl")
            missing = [p for p in need if not p.is_file()]
            if missing:
                raise LctxError(f"--data-dir {str(root)!r} has no {missing[0].relative_to(root)} for {sp.task}; "
                                f"point it at a folder with {layout} (e.g. ../shared/data; `lctx data --out DIR --only "
                                f"{sp.task.split('_')[0]}` fetches it), or unset it to load the Hugging Face hub copy")
    return specs, ("local" if local else "hub")


def spec_files(sp: LmEvalSpec, root: Path) -> list[Path]:
    """The local data files one spec reads (its test and dev/few-shot files under ``root``)."""
    if sp.task == "mmlu":
        return [root / "mmlu" / s / f"{sp.subject}_{s}.csv" for s in ("test", "dev")]
    return [root / "arc" / f for f in ARC_FILES[sp.task]]


def write_task_configs(specs: list[LmEvalSpec], data_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write one lm-eval YAML task config per local spec into ``out_dir``; return the paths.

    Each config ``include`` s lm-eval's own YAML (``arc/arc_easy.yaml``, ``mmlu/default/mmlu_<subject>.yaml``)
    and overrides only the task name, tag and data source (``custom_dataset: !function
    lctx.tasks.lmeval.local_dataset`` with the folder in ``dataset_kwargs``), so prompts, targets and
    metrics stay lm-eval's. Load them with ``TaskManager(include_path=out_dir, include_defaults=False)``.
    """
    lm_eval_tasks = _lm_eval_dir() / "tasks"
    root = Path(data_dir).resolve()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for sp in specs:
        if sp.task == "mmlu":
            include = lm_eval_tasks / "mmlu" / "default" / f"mmlu_{sp.subject}.yaml"
            kw = {"kind": "mmlu", "path": str(root / "mmlu"), "subject": sp.subject}
            extra = {"task_alias": sp.subject}
        else:
            include = lm_eval_tasks / "arc" / f"{sp.task}.yaml"
            kw = {"kind": sp.task, "path": str(root / "arc")}
            # no train split in the local copy: few-shot examples (if asked for) come from Dev
            extra = {"training_split": None, "validation_split": "validation", "test_split": "test"}
        cfg = {"include": str(include), "task": sp.lmeval_name, "tag": "lctx_lmeval",
               "dataset_path": kw["path"], "dataset_name": None, **extra}
        lines = [f"{k}: {json.dumps(v)}" for k, v in cfg.items()]  # JSON scalars are valid YAML
        lines.append("custom_dataset: !function lctx.tasks.lmeval.local_dataset")
        lines.append("dataset_kwargs: " + json.dumps(kw))
        p = out / f"{sp.lmeval_name}.yaml"
        p.write_text("\n".join(lines) + "\n")
        paths.append(p)
    return paths


# -- the lm-eval model -----------------------------------------------------------------------------------
_LCTX_HFLM = None


def _row_key(ids) -> tuple[int, bytes]:
    """The key of one lm-eval input row (a list of token ids): (tokens without trailing zeros, a 16-byte
    BLAKE2b digest of them as int64), as :class:`LctxHFLM` notes its requests and finds its batch's rows (lm-eval
    right-pads with zeros). A digest instead of the tokens keeps the notes small (a run's requests, 16 bytes each)."""
    n = len(ids)
    while n and ids[n - 1] == 0:
        n -= 1
    return n, hashlib.blake2b(array.array("q", ids[:n]).tobytes(), digest_size=16).digest()


def lctx_hflm_class():
    """lm-eval's ``HFLM`` with BOS handling for native lctx models and continuation-only logits, registered as
    lm-eval model ``"lctx"``.

    ``LctxHFLM(pretrained=model_or_dir, tokenizer=..., force_bos=None, chat_source=None, block_bytes=None,
    **HFLM kwargs)``: with ``force_bos`` (default: the model's ``model_type`` is ``"lctx"``) every encoded context
    and context + continuation starts with the tokenizer's BOS id, as in lctx training; its chat template renders
    with lctx's limits (``chat_source`` names the template's source in their errors).

    Log-likelihoods: lm-eval stays the engine (its requests, ``Collator`` batches, padding, log-softmax, slicing,
    metrics), but a batch's logits are computed only where lm-eval reads them. lm-eval's ``HFLM`` asks its model
    for [B, P, V] logits of B right-padded rows of P tokens and keeps them plus a log-softmax copy (SmolLM2-135M,
    5-shot MMLU at batch 32: 22.74 GiB peak RSS), while it scores only the last ``len(continuation)`` positions of
    each row's real tokens. ``LctxHFLM._loglikelihood_tokens`` notes, per request, its input row (lm-eval's
    ``(context + continuation)[-(max_length + 1):][:-1]``) and continuation length; ``_model_call`` finds each
    row of the batch among them (its tokens less the right padding, zeros), runs the model without a KV cache to
    its last hidden states, keeps for row b the K positions ending at its real length L_b (K = the batch's longest
    continuation; a forward pre-hook on the output embeddings gathers them), and applies the output embeddings
    there only: [B, K, V], which ``_select_cont_toks`` slices as ``logits[K - contlen:]``, the same positions lm-eval
    slices from the full logits (``logits[L_b - contlen:L_b]``). The rows go through the model in row blocks of
    :func:`lctx.models.adapters.memory.lmeval_block_rows` (planned working set ``block_bytes``, default
    :data:`~lctx.models.adapters.memory.LMEVAL_BLOCK_BYTES`), each at the batch's padded length P, as lm-eval
    runs them (length-dependent RoPE sees the same length). lm-eval's rolling log-likelihood goes the same way
    (its windows are requests whose continuation is the window: no saving, the same numbers). Where a row is not
    found (another caller of ``_model_call``, e.g. lm-eval's batch-size detection; a row whose trailing real zeros
    make its length ambiguous; seq2seq models) the batch takes lm-eval's own full-logit path. The numbers equal lm-eval's ``hf``
    model on the same weights up to float summation order (tests/test_lmeval.py;
    results/2026-12-02-lmeval-lean/README.md). Defined lazily because importing lm-eval takes seconds.
    """
    global _LCTX_HFLM
    if _LCTX_HFLM is not None:
        return _LCTX_HFLM
    from lctx.models import register_with_transformers  # lazy: loads lctx.models (its kernels load triton)

    register_with_transformers()  # model_type "lctx" for the Auto classes, also after a light import (cli)
    import torch  # lazy: loads torch (lctx list tasks imports this module; tests/test_startup.py)
    from lm_eval.api.registry import register_model  # lazy: loads lm_eval (lctx list tasks imports this module; tests/test_startup.py)
    from lm_eval.models.huggingface import HFLM  # lazy: loads lm_eval, transformers

    from lctx.models.adapters.memory import LMEVAL_BLOCK_BYTES, lmeval_block_rows  # lazy: loads torch

    class LctxHFLM(HFLM):
        """lm-eval ``hf`` backend; prepends BOS for native lctx checkpoints and computes logits at the scored
        continuation positions only (see :func:`lctx_hflm_class`)."""

        def __init__(self, pretrained, force_bos: bool | None = None, chat_source: str | None = None,
                     block_bytes: int | None = None, **kwargs):
            kwargs.setdefault("backend", "causal")
            super().__init__(pretrained=pretrained, **kwargs)
            if force_bos is None:
                force_bos = getattr(self.model.config, "model_type", None) == "lctx"
            self.force_bos = bool(force_bos) and self.tokenizer.bos_token_id is not None
            self.chat_source = chat_source or "the model"  # where the chat template comes from, for messages
            self._rolling = False
            self.block_bytes = int(block_bytes) if block_bytes else LMEVAL_BLOCK_BYTES
            self._cont_rows = None  # {row key: {real length: longest continuation}} of the requests being scored
            self._packed = False  # the last _model_call returned continuation-only logits
            self._blocks: dict[tuple[int, int], int] = {}  # (padded length, K) -> rows per block
            self.lean_calls = 0  # _model_call batches that took the continuation-only path (tests, diagnostics)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
            """lm-eval's ``_loglikelihood_tokens``, with every request's input row noted first (row key ->
            real length -> longest continuation), so that ``_model_call`` can compute its logits only at the
            continuation (``requests``: lm-eval's ``((context, continuation), context ids, continuation ids)``)."""
            rows: dict = {}
            if self.backend == "causal":
                for _, ctx, cont in requests:
                    inp = (list(ctx) + list(cont))[-(self.max_length + 1):][:-1]  # lm-eval's input row
                    lens = rows.setdefault(_row_key(inp), {})
                    lens[len(inp)] = max(lens.get(len(inp), 0), len(cont))
            outer, self._cont_rows = self._cont_rows, rows
            try:
                return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
            finally:
                self._cont_rows, self._packed = outer, False

        def _cont_plan(self, inps) -> tuple[list[int], int] | None:
            """(real length of each row, K = the longest continuation) of a batch whose every row is a noted
            request (:meth:`_loglikelihood_tokens`), else None. A row is its real tokens then zeros (lm-eval's
            right padding, ``pad_and_concat``); its key is its tokens without the trailing zeros, so a request that
            itself ends in zeros is found too, and one whose key has two real lengths that fit is ambiguous: None."""
            if not self._cont_rows or self.backend != "causal" or inps.dim() != 2:
                return None
            lengths, conts = [], []
            for row in inps.cpu():
                nz = torch.nonzero(row)
                n = int(nz[-1]) + 1 if len(nz) else 0
                lens = {L: c for L, c in self._cont_rows.get(_row_key(row[:n].tolist()), {}).items()
                        if L <= inps.shape[1]}
                if len(lens) != 1:
                    return None
                (L, c), = lens.items()
                lengths.append(L)
                conts.append(c)
            return lengths, max(conts)

        def _block_rows(self, P: int, K: int) -> int:
            """Rows per block for a batch padded to P tokens with K scored positions a row
            (:func:`lctx.models.adapters.memory.lmeval_block_rows` with :attr:`block_bytes`), planned once per (P, K)."""
            if (P, K) not in self._blocks:
                self._blocks[(P, K)] = lmeval_block_rows(self.model.config, P, K, dtype=self.model.dtype,
                                                         budget=self.block_bytes, device=self.device)
            return self._blocks[(P, K)]

        def _model_call(self, inps, attn_mask=None, labels=None):
            """The batch's logits: [B, K, V] at the K positions before each row's end (K = its longest
            continuation; :func:`lctx_hflm_class`) when every row is a noted request, else lm-eval's full
            [B, P, V] (seq2seq calls, other callers: lm-eval's own path).

            Raises:
                LctxError: NaN or infinite logits (:func:`lctx.errors.check_finite_logits`)."""
            plan = self._cont_plan(inps) if attn_mask is None and labels is None else None
            if plan is None:
                self._packed = False
                logits = super()._model_call(inps, attn_mask=attn_mask, labels=labels)
            else:
                logits = self._cont_logits(inps, *plan)
                self._packed = True
                self.lean_calls += 1
            check_finite_logits(logits, "lm-eval model call")  # the shared check of every task's logits
            return logits

        def _cont_logits(self, inps, lengths: list[int], K: int):
            """[B, K, V] logits of ``inps`` [B, P] (right-padded rows of real lengths ``lengths``) at positions
            L_b - K .. L_b - 1 of row b (clamped at 0: a row shorter than K reads only its last contlen <= L_b),
            computed in row blocks at the full padded length P with no KV cache; the output embeddings see only
            those positions (a forward pre-hook gathers them). A model that does not call its output embeddings
            module (no hook fired) gives full logits, from which the same positions are taken."""
            B, P = inps.shape
            idx = (torch.tensor(lengths)[:, None] - K + torch.arange(K)[None, :]).clamp_(min=0).to(inps.device)
            head = self.model.get_output_embeddings()
            step = self._block_rows(P, K)
            out = None
            for s in range(0, B, step):
                sel = idx[s:s + step]
                fired = []

                def gather(module, args, sel=sel, fired=fired):
                    h = args[0]
                    if fired or h.dim() != 3 or h.shape[1] != P:  # once, on the full hidden states only
                        return None
                    fired.append(True)
                    return (h.gather(1, sel.to(h.device)[..., None].expand(-1, -1, h.shape[-1])),) + tuple(args[1:])

                handle = head.register_forward_pre_hook(gather) if head is not None else None
                try:
                    with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                                         enabled=self.mixed_precision_dtype is not None):
                        lg = self.model(inps[s:s + step], use_cache=False).logits
                finally:
                    if handle is not None:
                        handle.remove()
                if not fired:  # the head was not called as a module: the full logits, then the same positions
                    lg = lg.gather(1, sel.to(lg.device)[..., None].expand(-1, -1, lg.shape[-1]))
                if out is None:
                    out = lg.new_empty((B, K, lg.shape[-1]))
                out[s:s + len(lg)] = lg
                del lg
            return out

        def _select_cont_toks(self, logits, contlen=None, inplen=None):
            """lm-eval's slice of one row's continuation logits; on continuation-only logits ([K, V], the row's
            last K positions) its last ``contlen`` rows, the positions lm-eval's ``logits[inplen - contlen:
            inplen]`` takes from the full row (lm-eval's ``inplen`` argument is then shifted by K - P and not
            needed)."""
            if self._packed:
                return logits[logits.shape[0] - contlen:]
            return super()._select_cont_toks(logits, contlen=contlen, inplen=inplen)

        def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
            """lm-eval's ``tok_encode`` (a text that starts with the BOS's text, a chat template's ``{{ bos_token }}``,
            gets no second one: lm-eval's ``has_bos_prefix``), with a native lctx model's BOS first (``force_bos``);
            inside :meth:`loglikelihood_rolling` without any special token (the windows are conditioned on
            ``prefix_token_id`` already: a tokenizer that adds BOS, Llama's, Gemma's, would have a second BOS scored
            after it, lm-eval #3333's behaviour, which lm-eval 0.4.13 still has)."""
            if self._rolling and add_special_tokens is None:
                add_special_tokens = False  # BOS exactly once: prefix_token_id is the rolling windows' context
            ids = super().tok_encode(string, add_special_tokens=add_special_tokens, **kwargs)
            bos = self.tokenizer.bos_token_id
            if (self.force_bos and not self._rolling and add_special_tokens is not False
                    and (not ids or ids[0] != bos)):
                ids = [bos] + list(ids)
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
            """lm-eval's ``HFLM.apply_chat_template`` (a template that refuses the history is given it again
            without its system turn), the template rendered with lctx's limits
            (:func:`lctx.chat.render_chat`; past one: :class:`~lctx.errors.LctxError`)."""
            import jinja2  # noqa: PLC0415  (lm-eval imports it already)


            kw = dict(add_generation_prompt=add_generation_prompt, continue_final_message=not add_generation_prompt,
                      source=self.chat_source, variables=getattr(self, "chat_template_args", None))
            try:
                return render_chat(self.tokenizer, chat_history, **kw)
            except jinja2.exceptions.TemplateError:
                return render_chat(self.tokenizer, [m for m in chat_history if m["role"] != "system"], **kw)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            """lm-eval's rolling log-likelihood, with the text's tokens encoded *without* a BOS, neither the forced
            one nor the one a tokenizer adds (:meth:`tok_encode`): lm-eval already conditions the first window on
            ``prefix_token_id`` (BOS), so a BOS in the token list would be scored as the first token after BOS
            (counted twice: lm-eval #3333)."""
            self._rolling = True
            try:
                return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)
            finally:
                self._rolling = False

    _LCTX_HFLM = register_model("lctx")(LctxHFLM)
    return _LCTX_HFLM


_SERVED_LM = None
#: lm-eval's ``max_length`` for a served model or one over the protocol: never reached, so lm-eval never cuts a
#: request from the left
#: (a prompt longer than the server's context is the server's refusal, or a cut its ``usage.prompt_tokens`` shows:
#: an error, never a score of a cut prompt)
SERVED_MAX_LENGTH = 1 << 40


class LlRequest(tuple):
    """One log-likelihood request of :class:`LctxCompletionsLM`: ``(ids, text, n_cont)``: lm-eval's ids (context +
    continuation, the BOS first where the model takes one), their text (context + continuation as lm-eval gave
    them; None for a request without one) and the continuation's tokens at the end."""

    __slots__ = ()

    def __new__(cls, ids, text, n_cont):
        return super().__new__(cls, (list(ids), text, int(n_cont)))


def served_lmeval_class():
    """lm-eval's OpenAI-completions model (``lm_eval.models.openai_completions.LocalCompletionsAPI``, registered as
    ``local-completions``) over an lctx :class:`~lctx.models.adapters.server.ServerAdapter`: mmlu/arc through a
    served model. Defined lazily (importing lm-eval takes seconds).

    ``LctxCompletionsLM(lm, batch_size=None)``: ``base_url`` and ``model`` from ``lm.lmeval_api_model()`` (which
    raises :class:`~lctx.errors.MetricUnavailable` when the trust probe did not pass), and lm-eval's own request
    flow (its ``loglikelihood``: ``_encode_pair``, the ``Collator`` order, the request cache hook) and payload
    (``_create_payload``: ``echo``, ``logprobs`` 1, ``max_tokens`` 1, ``temperature`` 0, the seed). What differs:

    * tokens are the adapter's (``lm.encode``: the server's ``/tokenize`` / ``/extras/tokenize`` or the local
      ``--tokenizer``), with the model's BOS first as the server counts it (``tok_encode``);
    * each request goes through the adapter (``lm.prompt_logprobs``: the endpoints' ``openai`` clients, their API key,
      retries and timeouts; token ids to a server that takes them, else the request's text; ``usage.prompt_tokens``
      checked, so a cut prompt is an error, never a score), ``batch_size`` requests (default ``lm.concurrency``) in
      flight at once;
    * the echo is lined up with the ids by the adapter (``_echoed``: a BOS left out of the echo, and all, fewer or
      none of the generated tokens), not by lm-eval's ``parse_logprobs``, which takes ``token_logprobs[ctxlen:-1]``
      and so drops the continuation's last token when the server returns no generated token's entry (llama-cpp-python
      leaves out the last one; a model that stops at once generates none);
    * no left truncation (:data:`SERVED_MAX_LENGTH`).

    Returns the class. Source: lm-eval 0.4.13 ``lm_eval/models/api_models.py`` (``TemplateAPI``),
    ``lm_eval/models/openai_completions.py``.
    """
    global _SERVED_LM
    if _SERVED_LM is not None:
        return _SERVED_LM
    from concurrent.futures import ThreadPoolExecutor  # lazy

    from lm_eval.models.openai_completions import LocalCompletionsAPI  # lazy: loads lm_eval

    class LctxCompletionsLM(LocalCompletionsAPI):
        """lm-eval ``local-completions`` over a served lctx model (see :func:`served_lmeval_class`)."""

        def __init__(self, lm, batch_size: int | None = None):
            info = lm.lmeval_api_model()
            n = max(1, int(batch_size or info.get("concurrency") or 1))
            super().__init__(base_url=info["base_url"], model=info["model"], tokenizer_backend="none",
                             batch_size=n, num_concurrent=1, max_retries=1, seed=int(info.get("seed") or 0),
                             max_length=SERVED_MAX_LENGTH, add_bos_token=False)
            self.lm = lm
            self.tokenizer = _AdapterTokenizer(lm)  # lm-eval's loglikelihood needs one; every use is overridden
            self.chat_source = lm.chat_source()

        # -- text: the adapter's tokenizer
        def tok_encode(self, string, left_truncate_len=None, add_special_tokens=None, **kwargs):
            """``lm.encode(string)`` with the model's BOS first (``add_special_tokens`` not False), as the server
            counts a prompt, and exactly once: a text that starts with the BOS's own text (a chat template that
            writes ``{{ bos_token }}``) is encoded without it (:meth:`sent_text`), as the server, which puts its
            BOS before every text prompt, is sent it (lm-eval's ``has_bos_prefix``; lm-eval 0.4.9's vLLM model sent
            two, ``[2, 2, 105, ...]`` for Gemma)."""
            if not isinstance(string, str):
                return [self.tok_encode(x, left_truncate_len, add_special_tokens) for x in string]
            bos = self.lm.bos_id
            if add_special_tokens is not False and bos is not None:
                ids = list(self.lm.encode(self.sent_text(string)))
                ids = ids if ids[:1] == [bos] else [bos] + ids  # a tokenizer that wrote one itself: kept, not doubled
            else:
                ids = list(self.lm.encode(string))
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def sent_text(self, text: str) -> str:
            """``text`` as the server is sent it: without a leading BOS text (the tokenizer's ``bos_token``, e.g.
            ``<s>``, ``<bos>``, ``<|begin_of_text|>``) when the model takes a BOS, which the server puts first
            itself (and :meth:`tok_encode` counts)."""
            bos = self.lm.bos_id
            bos_text = _bos_text(self.lm.tokenizer) if bos is not None else None
            return text[len(bos_text):] if bos_text and text.startswith(bos_text) else text

        def decode_batch(self, tokens):
            """The adapter's text of each row."""
            return [self.lm.decode(list(t)) for t in tokens]

        @property
        def prefix_token_id(self):
            """The BOS (else EOS) an empty context is conditioned on."""
            eos = getattr(self.lm.tokenizer, "eos_token_id", None)
            return self.lm.bos_id if self.lm.bos_id is not None else eos

        @property
        def eot_token_id(self):
            """The tokenizer's EOS id, where it has one."""
            return getattr(self.lm.tokenizer, "eos_token_id", None)

        @property
        def tokenizer_name(self) -> str:
            """The tokenizer's fingerprint (lm-eval keys its chat-templated request cache by it)."""
            return "lctx-" + self.lm.tokenizer_fingerprint()

        @property
        def api_key(self) -> str:
            """The key of the adapter's first endpoint client, in memory only (lm-eval's own transport is not
            used: requests go through the adapter)."""
            key = getattr(self.lm.endpoints[0].client, "api_key", "") or ""
            return "" if key == "no-key" else key

        def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
            """The adapter's chat template rendered by lctx (:func:`lctx.chat.render_chat`), as
            :func:`lctx_hflm_class`'s; a template that refuses the history gets it without its system turn."""
            import jinja2  # noqa: PLC0415  (lm-eval imports it already)

            kw = dict(add_generation_prompt=add_generation_prompt, continue_final_message=not add_generation_prompt,
                      source=self.chat_source)
            try:
                return render_chat(self.lm.tokenizer, chat_history, **kw)
            except jinja2.exceptions.TemplateError:
                return render_chat(self.lm.tokenizer, [m for m in chat_history if m["role"] != "system"], **kw)

        # -- requests: the adapter's
        def batch_loglikelihood_requests(self, chunks):
            """lm-eval's (ids, context lengths, cache keys), each input an :class:`LlRequest` carrying its text."""
            inputs, ctxlens, keys = super().batch_loglikelihood_requests(chunks)
            reqs = [LlRequest(inp, None if key is None else key[0] + key[1], len(inp) - c)
                    for inp, c, key in zip(inputs, ctxlens, keys)]
            return reqs, ctxlens, keys

        def _one(self, req: LlRequest):
            ids, text, n_cont = req
            if self.lm.token_prompts or text is None:
                send = ids
            else:  # a server that takes text tokenises the whole text: score its tokens (the continuation's are
                send = self.tok_encode(text)  # lm-eval's own: _encode_pair cuts them from the whole text's)
                text = self.sent_text(text)  # its BOS text left out: the server puts its own BOS first
                if send[len(send) - n_cont:] != ids[len(ids) - n_cont:]:
                    from lctx.errors import ServerReplyError  # noqa: PLC0415

                    raise ServerReplyError(f"{self.lm.path}: the text of an lm-eval request tokenises into other "
                                           "continuation tokens than lm-eval's; the echo cannot be lined up")
            body = self._create_payload(send, generate=False, seed=self._seed)
            body = {k: v for k, v in body.items() if k not in ("model", "prompt")}
            lps, tops = self.lm.prompt_logprobs(send, text if not self.lm.token_prompts else None,
                                                what="an lm-eval log-likelihood", **body)
            return lps[len(send) - n_cont:], tops[len(send) - n_cont:]

        def model_call(self, messages, *, generate: bool = True, gen_kwargs=None, **kwargs):
            """The echoed log-probabilities of each :class:`LlRequest` of ``messages`` (its continuation's
            ``(logprobs, tops)``), at most ``batch_size`` requests in flight.

            Raises:
                NotImplementedError: ``generate`` (mmlu/arc only score log-likelihoods).
                MetricUnavailable, ServerReplyError, ServerUnreachable: as ``lm.prompt_logprobs``."""
            if generate:
                raise NotImplementedError("lctx runs only log-likelihood tasks through a served lm-eval model")
            if len(messages) == 1:
                return [self._one(messages[0])]
            with ThreadPoolExecutor(max_workers=min(len(messages), self._batch_size)) as pool:
                return list(pool.map(self._one, messages))

        def parse_logprobs(self, outputs, tokens=None, ctxlens=None, **kwargs):
            """lm-eval's ``(sum of the continuation's log-probabilities, every token the first choice)`` per
            request, from :meth:`model_call`'s aligned outputs.

            Raises:
                ServerReplyError: an echoed continuation token without a log-probability."""
            from lctx.errors import ServerReplyError  # noqa: PLC0415

            res = []
            for lps, tops in outputs:
                if any(v is None for v in lps):
                    raise ServerReplyError(f"{self.lm.path}: the echo has no log-probability for a continuation "
                                           "token of an lm-eval request")
                greedy = all(not top or v >= top[0] - 1e-9 for v, top in zip(lps, tops))
                res.append((float(sum(lps)), bool(greedy)))
            return res

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            """Not used by mmlu/arc.

            Raises:
                NotImplementedError: always."""
            raise NotImplementedError("lctx runs mmlu/arc (log-likelihoods) through a served lm-eval model")

        def generate_until(self, requests, disable_tqdm: bool = False):
            """Not used by mmlu/arc.

            Raises:
                NotImplementedError: always."""
            raise NotImplementedError("lctx runs mmlu/arc (log-likelihoods) through a served lm-eval model")

    _SERVED_LM = LctxCompletionsLM
    return _SERVED_LM


def _bos_text(tok) -> str | None:
    """The text of a tokenizer's BOS token (``bos_token``, else its ``special_tokens_map``'s: a served model's
    ``/props``), or None."""
    text = getattr(tok, "bos_token", None)
    if not isinstance(text, str) or not text:
        text = (getattr(tok, "special_tokens_map", None) or {}).get("bos_token")
    return text if isinstance(text, str) and text else None


class _AdapterTokenizer:
    """The few tokenizer members lm-eval reads of an API model's ``tokenizer`` outside the overridden methods (its
    results' tokenizer info), from a served adapter."""

    def __init__(self, lm):
        self.lm = lm
        tok = lm.tokenizer
        self.bos_token_id, self.eos_token_id = lm.bos_id, getattr(tok, "eos_token_id", None)
        self.pad_token_id = getattr(tok, "pad_token_id", None)
        specials = getattr(tok, "special_tokens_map", None) or {}
        self.bos_token, self.eos_token = specials.get("bos_token"), specials.get("eos_token")
        self.pad_token = specials.get("pad_token")

    def encode(self, text: str) -> list[int]:
        """``lm.encode``."""
        return self.lm.encode(text)

    def decode(self, ids) -> str:
        """``lm.decode``."""
        return self.lm.decode(list(ids))


# -- the one bridge: any model adapter as lm-eval's model ---------------------------------------------------
def capabilities(lm):
    """:func:`lctx.models.adapters.protocol.capabilities` of ``lm``."""
    from lctx.models.adapters import protocol  # lazy: lctx.models loads torch (lctx list tasks imports this module)

    return protocol.capabilities(lm)


def optional(lm, name: str):
    """:func:`lctx.models.adapters.protocol.optional` of ``lm``: its optional member ``name`` or the default."""
    from lctx.models.adapters import protocol  # lazy: lctx.models loads torch (lctx list tasks imports this module)

    return protocol.optional(lm, name)


_ADAPTER_LM = None


def adapter_lmeval_class():
    """lm-eval's ``TemplateLM`` over the :class:`~lctx.models.adapters.protocol.ModelAdapter` protocol alone: mmlu/arc
    on any adapter (the ``"protocol"`` bridge, :class:`ProtocolBridge`). Defined lazily (importing lm-eval takes
    seconds).

    ``LctxAdapterLM(lm)``: lm-eval's own request flow (``TemplateLM.loglikelihood``: ``_encode_pair``, the empty-context
    rule, the request cache hook) with

    * tokens from the adapter: ``tok_encode`` is ``lm.encode`` with ``lm.bos_id`` first, exactly once (a text whose
      tokens already start with it, a chat template's ``{{ bos_token }}``, gets no second one), as ``lm.prompt`` puts it
      first in every lctx prompt;
    * each request scored through the protocol: the requests of one context share one ``lm.prefix(context ids)`` (MMLU's
      four choices: one prefill), and each continuation is ``lm.score_continuation(handle, continuation ids)``: lm-eval's
      ``(sum of its log-probabilities, every token the first choice)``; the handles of different contexts go
      ``concurrency`` at a time (the capability; 1 in process);
    * no left truncation (:data:`SERVED_MAX_LENGTH`): a context past the model's length is the adapter's error;
    * a chat template (``--chat-template on``) through the adapter's ``chat_prompt`` capability (the history without
      its system turn: the adapter adds its own system prompt, which ``lctx.evaluate`` checked is the run's).

    An adapter that gives no score (``score_continuation`` raises :class:`~lctx.errors.MetricUnavailable`) makes every
    metric of the evaluation unavailable with that reason, never 0. Returns the class. Source: lm-eval 0.4.13
    ``lm_eval/api/model.py`` (``TemplateLM``).
    """
    global _ADAPTER_LM
    if _ADAPTER_LM is not None:
        return _ADAPTER_LM
    from concurrent.futures import ThreadPoolExecutor  # lazy

    from lm_eval.api.model import TemplateLM  # lazy: loads lm_eval

    class LctxAdapterLM(TemplateLM):
        """lm-eval's model over a model adapter's protocol (see :func:`adapter_lmeval_class`)."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm
            self.workers = capabilities(lm).concurrency or 1
            self.max_length = SERVED_MAX_LENGTH
            self.chat_source = (optional(lm, "chat_source") or (lambda: f"model {lm.name!r}"))()

        @property
        def eot_token_id(self):
            """None: the protocol names no end-of-text token (mmlu/arc never ask for one)."""
            return None

        @property
        def prefix_token_id(self):
            """The BOS an empty context is conditioned on (``lm.bos_id``; None: the continuation's first token)."""
            return self.lm.bos_id

        @property
        def tokenizer_name(self) -> str:
            """The tokenizer's fingerprint (lm-eval keys its chat-templated request cache by it)."""
            return "lctx-" + self.lm.tokenizer_fingerprint()

        def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
            """``lm.encode(string)`` with ``lm.bos_id`` first unless ``add_special_tokens`` is False, and exactly once:
            ids that already start with it (a chat template's BOS text) keep theirs."""
            ids = list(self.lm.encode(string))
            bos = self.lm.bos_id
            if add_special_tokens is not False and bos is not None and ids[:1] != [bos]:
                ids = [bos] + ids
            return ids[-left_truncate_len:] if left_truncate_len else ids

        def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
            """The conversation in the adapter's chat template (its ``chat_prompt``), its system turn the adapter's.

            Raises:
                LctxError: the adapter renders no conversation, or lm-eval asks to continue a final message."""
            chat = optional(self.lm, "chat_prompt")
            if chat is None or not add_generation_prompt:
                raise LctxError(f"--chat-template on: model {self.lm.name!r} renders no conversation for lm-eval (it "
                                "has no chat_prompt(), docs/adapters.md#capabilities); use --chat-template off")
            return chat([m for m in chat_history if m["role"] != "system"]).text

        def _score_context(self, ctx: tuple, items: list) -> list:
            handle = self.lm.prefix(list(ctx))
            out = []
            for i, cont in items:
                sc = self.lm.score_continuation(handle, list(cont))
                out.append((i, (float(sum(sc.logprobs)), bool(all(sc.top1)))))
            return out

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            """``(log-likelihood, greedy)`` of each request ``((context, continuation), context ids, continuation
            ids)``, in order, through the adapter (one ``prefix`` per distinct context)."""
            groups: dict[tuple, list] = {}
            for i, (_, ctx, cont) in enumerate(requests):
                if ctx and ctx[0] is None:  # an empty context and no BOS: lm-eval's other rule, the first token
                    ctx, cont = cont[:1], cont[1:]
                groups.setdefault(tuple(ctx), []).append((i, cont))
            if self.workers > 1 and len(groups) > 1:
                with ThreadPoolExecutor(max_workers=min(self.workers, len(groups))) as pool:
                    done = [r for part in pool.map(lambda kv: self._score_context(*kv), groups.items()) for r in part]
            else:
                done = [r for kv in groups.items() for r in self._score_context(*kv)]
            out = [None] * len(requests)
            for i, ans in done:
                out[i] = ans
                self.cache_hook.add_partial("loglikelihood", requests[i][0], ans)
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            """Not used by mmlu/arc.

            Raises:
                NotImplementedError: always."""
            raise NotImplementedError("lctx runs mmlu/arc (log-likelihoods) through a model adapter's protocol")

        def generate_until(self, requests, disable_tqdm: bool = False):
            """Not used by mmlu/arc.

            Raises:
                NotImplementedError: always."""
            raise NotImplementedError("lctx runs mmlu/arc (log-likelihoods) through a model adapter's protocol")

    _ADAPTER_LM = LctxAdapterLM
    return _ADAPTER_LM


class LmEvalBridge:
    """One model adapter as lm-eval's evaluator sees it: ``model``, the lm-eval model object
    :meth:`LmEvalTask.score_all` gives ``simple_evaluate``. Which one is the adapter's capability
    (:func:`lctx.models.adapters.protocol.capabilities`: ``lmeval``), never its backend: :data:`LMEVAL_BRIDGES` maps it
    to a subclass, made by :meth:`LmEvalSuite.bridge` once per adapter. A new backend needs nothing here: it runs over
    the protocol (:class:`ProtocolBridge`), or offers ``lmeval_model()`` / ``lmeval_api_model()`` for a faster engine.

    ``kind``: the capability's value; ``planned``: lm-eval's batch runs in this process and its memory is planned
    (:func:`lctx.models.adapters.memory.check_lmeval_fits`).

    Raises (on construction):
        MetricUnavailable: the adapter gives no teacher-forced scores (its ``teacher_forced`` capability, e.g. a server
            whose echo failed the trust probe): every metric of the evaluation is unavailable, with the reason.
        LctxError: ``--chat-template on`` for a model that renders no conversation.
    """

    kind: str = ""
    planned: bool = False

    def __init__(self, lm, suite: "LmEvalSuite"):
        self.lm = lm
        self.ready()
        self.model = self.make(lm, suite)

    def make(self, lm, suite: "LmEvalSuite"):
        """The lm-eval model object of ``lm`` (a subclass's)."""
        raise NotImplementedError

    def ready(self) -> None:
        """Before each evaluation: teacher-forced scores must be available (lm-eval's log-likelihoods are).

        Raises:
            MetricUnavailable: they are not (the capability's reason)."""
        caps = capabilities(self.lm)
        if not caps.teacher_forced:
            raise MetricUnavailable(caps.unavailable)

    def set_batch_size(self, batch_size: int) -> None:
        """lm-eval requests per forward (only an in-process engine has one: others ignore it)."""


class ProtocolBridge(LmEvalBridge):
    """Any model adapter: :func:`adapter_lmeval_class` over its protocol."""

    kind = "protocol"

    def make(self, lm, suite):
        if suite.chat_template and optional(lm, "chat_prompt") is None:
            raise LctxError(f"--chat-template on: model {lm.name!r} renders no conversation for lm-eval's mmlu/arc "
                            "(no chat_prompt(), lmeval_model() or lmeval_api_model(): docs/adapters.md#capabilities); "
                            "use --chat-template off for it")
        return adapter_lmeval_class()(lm)


class HFBridge(LmEvalBridge):
    """An adapter with ``lmeval_model()`` (:class:`lctx.models.adapters.protocol.LmEvalCapable`): lm-eval's ``hf``
    engine (:class:`LctxHFLM`) over its transformers model, its batch planned."""

    kind = "hf"
    planned = True

    def make(self, lm, suite):
        model, tok = lmeval_model(lm)
        if suite.chat_template and not getattr(tok, "chat_template", None):
            raise LctxError(f"--chat-template on: the tokenizer of model {lm.name!r} has no chat template; "
                            "use --chat-template off (the default) for this model")
        source = optional(lm, "chat_source")
        return lctx_hflm_class()(pretrained=model, tokenizer=tok, batch_size=suite.batch_size,
                                 chat_source=source() if source else None)

    def ready(self) -> None:
        """:meth:`LmEvalBridge.ready`, then ``lmeval_model()``: lm-eval calls the model directly, so the adapter readies
        it (length-dependent RoPE gets its own per-forward behaviour back)."""
        super().ready()
        lmeval_model(self.lm)

    def set_batch_size(self, batch_size: int) -> None:
        """lm-eval's ``batch_size_per_gpu``."""
        self.model.batch_size_per_gpu = int(batch_size)


class ApiBridge(LmEvalBridge):
    """An adapter with ``lmeval_api_model()`` (:class:`lctx.models.adapters.protocol.LmEvalApiCapable`, a served
    model): lm-eval's ``local-completions`` engine (:func:`served_lmeval_class`), ``concurrency`` requests at a time."""

    kind = "api"

    def make(self, lm, suite):
        return served_lmeval_class()(lm)

    def ready(self) -> None:
        """:meth:`LmEvalBridge.ready`, then ``lmeval_api_model()`` (the trust probe's verdict, before any data or
        request).

        Raises:
            MetricUnavailable: the probe did not pass."""
        super().ready()
        self.lm.lmeval_api_model()


#: :attr:`lctx.models.adapters.protocol.Capabilities.lmeval` -> the bridge that runs it
LMEVAL_BRIDGES = {b.kind: b for b in (ProtocolBridge, HFBridge, ApiBridge)}


# -- running ---------------------------------------------------------------------------------------------
def _quiet_lm_eval():
    for name in ("lm_eval", "lm-eval", "lm_eval.models.huggingface"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets  # lazy: loads datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:
        pass


def _task_manager(source: str, config_dir: Path | None):
    """lm-eval ``TaskManager`` over the generated configs (local) or over lm-eval's own ``arc`` and
    ``mmlu/default`` folders (hub): indexing all of lm-eval's ~13k tasks takes a minute or more on 2 cores."""
    from lm_eval.tasks import TaskManager  # lazy: loads lm_eval

    if source == "local":
        return TaskManager(include_path=str(config_dir), include_defaults=False)
    root = _lm_eval_dir() / "tasks"
    return TaskManager(include_path=[str(root / "arc"), str(root / "mmlu" / "default")], include_defaults=False)


def load_tasks(specs: list[LmEvalSpec], source: str, data_dir, config_dir: Path) -> tuple[object, dict]:
    """Write configs (local data) and load every spec's lm-eval ``Task`` (reads its data).

    Returns (task_manager, {lmeval_name: Task}).

    Raises:
        LctxError: a task's data cannot be read (a file problem, or the hub unreachable).
    """
    _quiet_lm_eval()
    if source == "local":
        write_task_configs(specs, data_dir, config_dir)
    tm = _task_manager(source, config_dir)
    tasks = {}
    for sp in specs:
        try:
            tasks[sp.lmeval_name] = tm.load([sp.lmeval_name])["tasks"][sp.lmeval_name]
        except LctxError:
            raise
        except Exception as e:  # noqa: BLE001 - datasets/hub failures: one line, with the fix
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            where = ("the Hugging Face hub (offline?); pass --data-dir with mmlu/ and arc/ (e.g. ../shared/data)"
                     if source == "hub" else f"{data_dir}; check the files")
            raise LctxError(f"could not load lm-eval task {sp.lmeval_name!r} from {where} "
                            f"({type(e).__name__}: {first})") from None
    return tm, tasks


def _choice_labels(spec: LmEvalSpec, doc: dict, n: int) -> list[str]:
    if spec.task == "mmlu":
        return list("ABCD")[:n]
    return list(doc["choices"]["label"])


def sample_records(spec: LmEvalSpec, samples: list[dict], hflm=None) -> list[dict]:
    """Turn lm-eval ``log_samples`` entries of one task into partial lctx records.

    Each: {"sample": doc_id, "metrics": {"acc", ["acc_norm"]}, "n_tokens": context tokens (BOS
    included, before lm-eval's left truncation; ``None`` without ``hflm``), "extra": {"pred", "gold",
    "ll", ["pred_norm"], "truncated"}} where pred/gold are answer letters (MMLU) or ARC labels, ll the
    choices' log-likelihoods (nats, summed over each continuation's tokens); pred is the
    argmax of the choices' log-likelihoods, pred_norm of log-likelihood per character of the choice text
    (lm-eval's acc_norm, ``Task.process_results`` for ``multiple_choice``).
    """
    import numpy as np  # lazy: loads numpy (lctx.tasks imports this module: loaded today through niah, kept off this module's own cost)

    out = []
    for s in samples:
        lls = np.array([float(r[0]) for r in s["filtered_resps"]])
        conts = [a[1] for a in s["arguments"]]
        labels = _choice_labels(spec, s["doc"], len(lls))
        gold = int(s["target"])
        extra = {"pred": labels[int(np.argmax(lls))], "gold": labels[gold], "ll": [round(x, 4) for x in lls]}
        metrics = {"acc": float(s["acc"])}
        if "acc_norm" in s:
            metrics["acc_norm"] = float(s["acc_norm"])
            texts = s["doc"]["choices"]["text"]  # ARC; lm-eval divides by len(choice), without the space
            extra["pred_norm"] = labels[int(np.argmax(lls / np.array([float(len(c)) for c in texts])))]
        n_tokens = None
        if hflm is not None:
            ctx = s["arguments"][0][0]
            n_tokens = len(hflm.tok_encode(ctx))
            longest = max(len(hflm.tok_encode(ctx + c)) for c in conts)
            extra["truncated"] = bool(longest - 1 > hflm.max_length)
        out.append({"sample": int(s["doc_id"]), "metrics": metrics, "n_tokens": n_tokens, "extra": extra})
    return out


def _options(sp: LmEvalSpec, num_fewshot: int | None, source: str, chat_template: bool = False,
             system_prompt: str | None = None) -> dict:
    """The task options recorded with an lm-eval question (few-shot count, data source, MMLU subject, and
    the chat template and system prompt when ``--chat-template on``; with it off nothing is added, so
    records from before the option keep their keys)."""
    opts = {"num_fewshot": DEFAULT_FEWSHOT[sp.task] if num_fewshot is None else num_fewshot, "data": source}
    if sp.subject:
        opts["subject"] = sp.subject
    if chat_template:
        opts["chat_template"] = "on"
        if system_prompt is not None:
            opts["system_prompt"] = system_prompt
    return opts


class LmEvalSuite:
    """What the lm-eval tasks of one run share: lm-eval's loaded tasks (configs written once into a temporary
    folder that lives as long as the suite, data read on first use), one :class:`LmEvalBridge` per model adapter, and
    the run's settings (:func:`build_tasks`'s arguments)."""

    def __init__(self, specs: list[LmEvalSpec], source: str, data_dir=None, limit: int | None = None,
                 num_fewshot: int | None = None, seed: int = 0, batch_size: int = LMEVAL_BATCH_SIZE, chat_template: bool = False,
                 system_prompt: str | None = None, log=None):
        self.specs, self.source, self.data_dir, self.limit = specs, source, data_dir, limit
        self.num_fewshot, self.seed, self.batch_size, self.log = num_fewshot, seed, batch_size, log
        self.chat_template, self.system_prompt = bool(chat_template), system_prompt
        self._cfg = tempfile.TemporaryDirectory(prefix="lctx-lmeval-")
        self._loaded = None
        self._bridges: dict[int, LmEvalBridge] = {}

    def version(self) -> dict:
        """lm-eval's version, the task version of every lm-eval record (part of its fingerprint)."""
        import lm_eval  # noqa: PLC0415  (seconds to import: only when lm-eval tasks run)

        return {"lm_eval": getattr(lm_eval, "__version__", "?")}

    def loaded(self) -> tuple[object, dict]:
        """(task manager, {lmeval_name: lm-eval Task}), loaded on first call (:func:`load_tasks`).

        Raises:
            LctxError: a task's data cannot be read."""
        if self._loaded is None:
            self._loaded = load_tasks(self.specs, self.source, self.data_dir, Path(self._cfg.name))
        return self._loaded

    def bridge(self, lm) -> LmEvalBridge:
        """The :class:`LmEvalBridge` of ``lm``, made once per adapter: the one of :data:`LMEVAL_BRIDGES` its
        capabilities name (:func:`lctx.models.adapters.protocol.capabilities`, ``lmeval``).

        Raises:
            LctxError: ``--chat-template on`` for a model that renders no conversation (a tokenizer without a chat
                template).
            MetricUnavailable: a model whose teacher-forced scores are unavailable (a served model whose prompt
                log-probabilities failed the trust probe)."""
        if id(lm) not in self._bridges:
            self._bridges[id(lm)] = LMEVAL_BRIDGES[capabilities(lm).lmeval](lm, self)
        return self._bridges[id(lm)]

    def set_batch_size(self, batch_size: int) -> None:
        """lm-eval requests per forward from now on, also for the bridges already made (the memory check of
        :func:`lctx.models.adapters.memory.check_lmeval_fits` lowers it after :meth:`request_lengths` made them; a
        bridge without an in-process batch ignores it: a served model's requests go ``concurrency`` at a time)."""
        self.batch_size = int(batch_size)
        for bridge in self._bridges.values():
            bridge.set_batch_size(self.batch_size)

    def request_lengths(self, lm) -> dict[str, tuple[int, int, int]]:
        """{task label (``mmlu/<subject>``, ``arc_easy``): (longest request in tokens, requests, longest continuation
        in tokens)} of every task's questions (the first ``limit``) on ``lm``: the input rows lm-eval's
        ``HFLM._loglikelihood_tokens`` pads a batch to, how many rows there are (lm-eval's ``Collator``,
        ``group_by="contexts"``, runs the requests that share context + continuation[:-1] in one row: MMLU's
        `` A``..`` D`` share one), and the most positions of a row whose logits :class:`LctxHFLM` computes (its
        continuation: 1 for MMLU's letters; a continuation encoded alone, an estimate of lm-eval's, which
        encodes it after its context).

        The requests are lm-eval's own (``Task.build_all_requests`` with the few-shot count, sampler seed,
        chat template and system prompt that :meth:`LmEvalTask.score_all` gives ``simple_evaluate``); a
        request's length is its context's tokens (``tok_encode`` of lm-eval's model wrapper: the forced BOS of
        lctx models included) plus its longest continuation's, less the one token lm-eval drops
        (``inp[:-1]``), at most the wrapper's ``max_length`` (lm-eval truncates from the left). lm-eval encodes
        context + continuation as one string, so a token merged across the seam can make it one shorter:
        an upper estimate. Each distinct context is tokenised once (MMLU's four choices share one), the part
        shared by a task's contexts (the few-shot examples) once (:func:`context_tokens`). SmolLM2's 5-shot
        high_school_european_history: 3,148 tokens, lm-eval's own encoding 3,147.

        Raises:
            LctxError: a task's data cannot be read; ``--chat-template on`` with a tokenizer that has none.
        """
        _, tasks = self.loaded()
        hflm = self.bridge(lm).model
        out = {}
        for sp in self.specs:
            task = tasks[sp.lmeval_name]
            task.set_config(key="num_fewshot", value=DEFAULT_FEWSHOT[sp.task] if self.num_fewshot is None
                            else self.num_fewshot)  # as score_all does before simple_evaluate
            task.set_fewshot_seed(seed=self.seed)
            with quiet_progress(True), compiled_templates():
                task.build_all_requests(limit=self.limit, rank=0, world_size=1, system_instruction=self.system_prompt,
                                        apply_chat_template=self.chat_template, fewshot_as_multiturn=True,
                                        chat_template=hflm.apply_chat_template if self.chat_template else None,
                                        tokenizer_name=hflm.tokenizer_name if self.chat_template else "")
            cont_ids: dict[str, tuple] = {}  # continuation -> its tokens (encoded once)
            per_ctx: dict[str, int] = {}  # context -> its longest continuation's tokens
            rows = set()  # lm-eval's rows: its Collator runs the requests of one context + continuation[:-1] once
            for inst in task.instances:
                ctx, cont = inst.args[0], inst.args[1]
                stem = ctx.rstrip()  # lm-eval moves the context's trailing spaces to the continuation
                cont = ctx[len(stem):] + cont
                if cont not in cont_ids:
                    cont_ids[cont] = tuple(hflm.tok_encode(cont, add_special_tokens=False))
                per_ctx[stem] = max(per_ctx.get(stem, 0), len(cont_ids[cont]))
                rows.add((stem, cont_ids[cont][:-1]))
            ctx_tokens = context_tokens(list(per_ctx), hflm.tok_encode)
            longest = max((min(ctx_tokens[c] + n, hflm.max_length + 1) - 1 for c, n in per_ctx.items()), default=0)
            task._instances = None  # simple_evaluate builds its own; these strings need not stay in memory
            cont = max(per_ctx.values(), default=0)
            out[f"{sp.task}/{sp.subject}" if sp.subject else sp.task] = (longest, len(rows), cont)
        return out


#: contexts that share at least this many characters before a line break (lm-eval's few-shot examples) encode the
#: shared part once (:func:`context_tokens`)
SHARED_PREFIX_CHARS = 256


def context_tokens(contexts: list[str], encode) -> dict[str, int]:
    """{context: tokens} of lm-eval contexts as ``encode`` (an lm-eval model's ``tok_encode``) counts them; an empty
    context counts 1 (lm-eval's prefix token). Contexts that share a prefix of :data:`SHARED_PREFIX_CHARS` or more
    up to a line break (5-shot MMLU: the subject line and the five examples, ~80 % of each prompt) encode it
    once: tokens(prefix) + tokens(rest, no special tokens) + 1, an upper estimate (the one: a token merged across
    the cut, e.g. a blank line split into two newlines). Cost: one ``encode`` of each context's own part."""
    out = {c: 1 for c in contexts if not c}
    rest = [c for c in contexts if c]
    cut = os.path.commonprefix(rest).rfind("\n") + 1 if len(rest) > 1 else 0
    if cut < SHARED_PREFIX_CHARS:
        return {**out, **{c: len(encode(c)) for c in rest}}
    n_prefix = len(encode(rest[0][:cut]))
    return {**out, **{c: n_prefix + len(encode(c[cut:], add_special_tokens=False)) + 1 for c in rest}}


def lmeval_model(lm) -> tuple:
    """``lm.lmeval_model()``: (Hugging Face model, tokenizer) for lm-eval's ``hf`` backend
    (:class:`lctx.models.adapters.protocol.LmEvalCapable`).

    Raises:
        LctxError: an adapter without that capability (``lctx.evaluate`` refuses it before the run; this is the
            guard for other callers).
    """
    get = getattr(lm, "lmeval_model", None)
    if not callable(get):
        raise LctxError(f"mmlu/arc run lm-eval's hf backend, which needs a Hugging Face model, and model "
                        f"{getattr(lm, 'name', lm)!r} has none (no lmeval_model()); drop mmlu/arc for it, or pass a "
                        "checkpoint path")
    return get()


#: what one lm-eval question costs, in prefill tokens, for the progress bar's weights: lm-eval scores every
#: choice as a continuation of the prompt (MMLU 5-shot: ~500-token prompts x 4 choices)
QUESTION_COST_TOKENS = 2048


class LmEvalTask(Task):
    """One lm-eval task (an ARC set, or one MMLU subject) as a :class:`Task` the runner drives: its cells are
    the test questions (``sample`` = lm-eval's ``doc_id``; no length, no depth), scored all at once by lm-eval's
    evaluator (:attr:`~Task.whole`: ``lm_eval.simple_evaluate`` with ``samples=`` the questions not yet
    recorded). Records, resume key and provenance are the runner's, as for every task; their numbers are
    lm-eval's (its prompts, targets and ``acc``/``acc_norm``; :func:`sample_records`).

    ``name`` is ``mmlu`` / ``arc_easy`` / ``arc_challenge`` (MMLU's subject is :attr:`~Task.subtask` and in the
    options); version = lm-eval's version; the chunk size is not part of the fingerprint (lm-eval calls the
    model directly, not the adapter's chunked prefill). Made by :func:`build_tasks`, not registered in ``TASKS``.
    Runs on any model adapter (its :class:`LmEvalBridge`).
    """

    whole = True
    chunked = False
    higher_is_better = True
    adapter_needs = LMEVAL.adapter_needs

    def __init__(self, spec: LmEvalSpec, suite: LmEvalSuite):
        self.spec, self.suite = spec, suite
        self.name, self.subtask, self.metrics = spec.task, spec.subject, METRICS[spec.task]
        self.description = DESCRIPTION[spec.task]
        self.version = suite.version()
        super().__init__(**_options(spec, suite.num_fewshot, suite.source, suite.chat_template, suite.system_prompt))

    def data_files(self) -> dict[str, Path]:
        """The local test and few-shot files ({path under the data dir: path}); none from the hub."""
        if self.suite.source != "local":
            return {}
        root = Path(self.suite.data_dir)
        return {str(p.relative_to(root)): p for p in spec_files(self.spec, root)}

    def data_fingerprint(self) -> str | None:
        """The local files' digest (:meth:`Task.data_fingerprint`), or ``hub:<lm-eval task>`` from the hub."""
        return super().data_fingerprint() if self.suite.source == "local" else f"hub:{self.spec.lmeval_name}"

    def run_json(self) -> dict:
        """``{"lmeval": {lm_eval version, source, data_dir, limit, num_fewshot, seed}}`` for ``run.json``."""
        su = self.suite
        return {"lmeval": {**self.version, "source": su.source,
                           "data_dir": str(Path(su.data_dir).resolve()) if su.data_dir else None, "limit": su.limit,
                           "num_fewshot": su.num_fewshot, "seed": su.seed}}

    def cells(self, lengths, depths, samples) -> list[Cell]:
        """The test questions: ``Cell(None, None, doc_id)`` for the first ``limit`` (all when None); the run's
        lengths, depths and samples do not apply."""
        n = len(self.suite.loaded()[1][self.spec.lmeval_name].eval_docs)
        return [Cell(None, None, i) for i in range(min(self.suite.limit, n) if self.suite.limit else n)]

    def cost(self, lm, cell: Cell) -> float:
        """:data:`QUESTION_COST_TOKENS` per question."""
        return float(QUESTION_COST_TOKENS)

    def record_extra(self, sample: Sample) -> dict:
        """pred / gold / ll (/ pred_norm) / truncated of :func:`sample_records`, and ``lmeval_task``."""
        return dict(sample.meta)

    def request_cache_prefix(self) -> str | None:
        """The path prefix of lm-eval's request cache for this call (``simple_evaluate(use_cache=...)``; lm-eval
        adds ``_rank0.db``): ``<state_dir>/lmeval-requests-bs<batch size>`` when the runner gave a
        :attr:`~lctx.tasks.Task.state_dir`, else None (no cache). lm-eval keys a cached answer by the request
        alone (its method and text: prompt with its few-shot examples and chat template, continuation); the
        state folder is private to the model's content, the options, the data and the versions (the records'
        fingerprint), and the batch size (it pads, so it can change the last digits) is in the file name."""
        if self.state_dir is None:
            return None
        return str(Path(self.state_dir) / f"lmeval-requests-bs{self.suite.batch_size}")

    def score_all(self, lm, cells: list[Cell]) -> list[tuple[Sample, dict[str, float]]]:
        """Run ``lm_eval.simple_evaluate`` on the questions of ``cells`` with ``lm``'s lm-eval model (its
        :class:`LmEvalBridge`: over the protocol, or lm-eval's ``hf`` / ``local-completions`` engine where ``lm``
        offers one), k-shot (``--num-fewshot``, else :data:`DEFAULT_FEWSHOT`).
        In a run, lm-eval's request cache (:meth:`request_cache_prefix`, lm-eval's ``CachingLM``: sqlite, each
        answer stored as its batch finishes) keeps the answers of a call that is stopped before its records
        are written (``STOP_AT``, Ctrl-C), and the rerun's call takes them from there instead of the model.

        Raises:
            LctxError: ``--chat-template on`` with a tokenizer that has none; unreadable data.
            MetricUnavailable: a model without teacher-forced scores, e.g. a served model whose prompt
                log-probabilities failed the trust probe (the runner records every metric of every cell unavailable,
                with the reason).
            ServerUnreachable: the server stopped answering (the runner ends the run; a rerun resumes).
        """
        import lm_eval  # noqa: PLC0415  (seconds to import: only when lm-eval tasks run)

        sp, su = self.spec, self.suite
        k = DEFAULT_FEWSHOT[sp.task] if su.num_fewshot is None else su.num_fewshot
        bridge = su.bridge(lm)  # MetricUnavailable (no teacher-forced scores: the reason) before any data or request
        bridge.ready()  # each evaluation: scores still available; an in-process model readied for lm-eval's calls
        tm, tasks = su.loaded()
        hflm = bridge.model
        todo = [c.sample for c in cells]
        if su.log:
            su.log(f"{lm.name}: {sp.task}{'/' + sp.subject if sp.subject else ''} {len(todo)} questions, {k}-shot")
        # set k on the task itself: simple_evaluate(num_fewshot=...) never overrides a task whose
        # num_fewshot is already 0 (as an earlier call leaves it)
        tasks[sp.lmeval_name].set_config(key="num_fewshot", value=k)
        with quiet_git_probe(), quiet_progress(su.log is None), request_cache(hflm, self.request_cache_prefix()) as cache:
            res = lm_eval.simple_evaluate(
                model=hflm, tasks=[tasks[sp.lmeval_name]], samples={sp.lmeval_name: todo}, task_manager=tm,
                log_samples=True, bootstrap_iters=0, fewshot_random_seed=su.seed,
                apply_chat_template=su.chat_template, system_instruction=su.system_prompt, use_cache=cache)
        parts = {p["sample"]: p for p in sample_records(sp, res["samples"][sp.lmeval_name], hflm)}
        return [(Sample(c, [], parts[c.sample]["n_tokens"], None,
                        dict(parts[c.sample]["extra"], lmeval_task=sp.lmeval_name)), parts[c.sample]["metrics"])
                for c in cells]


def build_tasks(names: list[str], data_dir=None, limit: int | None = None, num_fewshot: int | None = None,
                seed: int = 0, batch_size: int = LMEVAL_BATCH_SIZE, chat_template: bool = False, system_prompt: str | None = None,
                log=None) -> list[LmEvalTask]:
    """The :class:`LmEvalTask` s of ``names`` (``mmlu``, ``mmlu_<subject>``, ``mmlu_<category>``, ``arc_easy``,
    ``arc_challenge``: one per ARC set and per MMLU subject), sharing one :class:`LmEvalSuite`. ``limit``: the
    first N test questions of each; ``num_fewshot``: None for :data:`DEFAULT_FEWSHOT`; ``seed``: lm-eval's
    few-shot sampler seed; ``batch_size``: lm-eval requests per forward; ``log``: gets one line per task and
    model (None: quiet). Nothing is loaded yet (lm-eval's data is read when the runner asks for the cells).

    Raises:
        LctxError: a bad ``limit`` or ``num_fewshot``, an unknown name, or missing local data
            (:func:`resolve_tasks`).
    """
    check_settings(limit, num_fewshot)
    specs, source = resolve_tasks(names, data_dir)
    if source == "hub":
        check_hub(specs)
    return make_tasks(specs, source, data_dir, limit, num_fewshot, seed, batch_size, chat_template, system_prompt, log)


def make_tasks(specs: list[LmEvalSpec], source: str, data_dir=None, limit: int | None = None,
               num_fewshot: int | None = None, seed: int = 0, batch_size: int = LMEVAL_BATCH_SIZE, chat_template: bool = False,
               system_prompt: str | None = None, log=None) -> list[LmEvalTask]:
    """:func:`build_tasks` from specs already resolved (:func:`resolve_tasks`).

    Raises:
        LctxError: a bad ``limit`` or ``num_fewshot``.
    """
    check_settings(limit, num_fewshot)
    suite = LmEvalSuite(specs, source, data_dir, limit, num_fewshot, seed, batch_size, chat_template, system_prompt,
                        log)
    return [LmEvalTask(sp, suite) for sp in specs]


#: the Hugging Face dataset each lm-eval task reads without ``--data-dir``
HUB_DATASETS = {"mmlu": "cais/mmlu", "arc_easy": "allenai/ai2_arc", "arc_challenge": "allenai/ai2_arc"}
_TRUE = ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``, default huggingface.co) answers a TCP connection on its
    port within ``timeout`` seconds; False when ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` is set."""
    import socket  # lazy: only the hub check opens a socket
    from urllib.parse import urlparse  # lazy: only the hub check parses HF_ENDPOINT

    if any(os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
        return True
    except OSError:  # no DNS, no route, refused, timed out
        return False


def _hub_cached(dataset: str) -> bool:
    """Whether ``dataset`` ("owner/name") has a copy in the Hugging Face caches (the hub's and datasets'), found
    as those libraries find them: ``HF_HUB_CACHE`` / ``HF_DATASETS_CACHE``, else under ``HF_HOME``, else under
    ``$XDG_CACHE_HOME/huggingface`` (default ``~/.cache/huggingface``), read now (source: huggingface_hub
    ``constants.py``, datasets ``config.py``); plus the libraries' own ``HF_HUB_CACHE`` / ``HF_DATASETS_CACHE``
    when they are already imported (they read the variables once, at import)."""
    import sys  # lazy

    home = Path(os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")))
    hubs = {Path(os.path.expanduser(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                                    or str(home / "hub")))}
    dss = {Path(os.path.expanduser(os.environ.get("HF_DATASETS_CACHE") or str(home / "datasets")))}
    if "huggingface_hub.constants" in sys.modules:
        hubs.add(Path(sys.modules["huggingface_hub.constants"].HF_HUB_CACHE))
    if "datasets.config" in sys.modules:
        dss.add(Path(sys.modules["datasets.config"].HF_DATASETS_CACHE))
    return (any((hub / ("datasets--" + dataset.replace("/", "--"))).is_dir() for hub in hubs)
            or any(any(ds.glob(dataset.replace("/", "___") + "*")) for ds in dss))


def _set_offline() -> None:
    """Put huggingface_hub and datasets in offline mode (cache only), also when they are already imported
    (both read the variables once, at import)."""
    import sys  # lazy

    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants as hc  # lazy: already loaded

        hc.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config as dc  # lazy: already loaded

        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(dc, k):
                setattr(dc, k, True)


def check_hub(specs: list[LmEvalSpec]) -> None:
    """Before lm-eval reads a hub dataset (no ``--data-dir``): with no network, refuse at once unless the
    dataset is in the local Hugging Face cache (then switch the hub clients to offline mode, which reads the
    cache without lm-eval's ~35 s of retries); with a network, do nothing.

    Raises:
        LctxError: the hub is unreachable and a task's dataset is not cached (names the fix: --data-dir).
    """
    if hub_reachable():
        return
    for sp in specs:
        dataset = HUB_DATASETS[sp.task]
        if not _hub_cached(dataset):
            raise LctxError(f"lm-eval task {sp.task!r} reads {dataset} from the Hugging Face hub, which this "
                            "machine cannot reach (offline), and it is not in the local Hugging Face cache; pass "
                            "--data-dir with mmlu/ and arc/ (e.g. ../shared/data)")
    _set_offline()


def check_settings(limit, num_fewshot) -> None:
    """Refuse a ``limit`` (questions per task) below 1 or a negative ``num_fewshot``; ``lctx run`` calls it before
    torch loads (:func:`lctx.harness.evaluate.evaluate`), and :func:`build_tasks` again.

    Raises:
        LctxError: one of those (names the flag and the fix).
    """
    if limit is not None and limit < 1:
        raise LctxError(f"--limit {limit} is not a positive number of questions; pass e.g. --limit 20")
    if num_fewshot is not None and num_fewshot < 0:
        raise LctxError(f"--num-fewshot {num_fewshot} is negative; pass 0 or more")


def mmlu_subject_table(table):
    """Per-subject MMLU accuracy from the results table: columns model, variant, subject, category,
    num_fewshot, metric, mean, stderr (sample std / sqrt(n)), n; status-ok rows only."""
    import pandas as pd  # lazy: loads pandas

    rows = table[(table["task"] == "mmlu") & (table["status"] == "ok")].copy()
    cols = ["model", "variant", "subject", "category", "num_fewshot", "metric", "mean", "stderr", "n"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    opts = rows["task_options"].map(json.loads)
    rows["subject"] = opts.map(lambda o: o.get("subject"))
    rows["num_fewshot"] = opts.map(lambda o: o.get("num_fewshot"))
    cats = mmlu_subjects()
    rows["category"] = rows["subject"].map(cats)
    g = rows.groupby(["model", "variant", "subject", "category", "num_fewshot", "metric"], dropna=False)["value"]
    agg = g.agg(mean="mean", std="std", n="count").reset_index()
    agg["stderr"] = agg["std"] / agg["n"].map(math.sqrt)
    return agg[cols]


@contextlib.contextmanager
def request_cache(hflm, prefix: str | None):
    """Within the block, ``prefix`` (or None) for ``simple_evaluate(use_cache=...)``; on exit, the sqlite file
    lm-eval's ``CachingLM`` opened through ``hflm``'s cache hook is committed and closed and the hook reset,
    so no connection outlives the call (the next call opens its own). Source: lm-eval 0.4
    ``lm_eval/api/model.py`` (``CachingLM``, ``CacheHook``)."""
    try:
        yield prefix
    finally:
        if prefix is not None:
            from lm_eval.api.model import CacheHook  # lazy: loads lm_eval

            db = getattr(getattr(hflm, "cache_hook", None), "dbdict", None)
            if db is not None:
                db.commit()
                db.close()
            hflm.set_cache_hook(CacheHook(None))


@contextlib.contextmanager
def quiet_progress(quiet: bool = True):
    """Within the block (when ``quiet``: ``lctx run --no-progress``), every tqdm bar is created with
    ``disable=True``: lm-eval draws its own bars ("Checking cached requests", "Tokenizing inputs", "Running
    loglikelihood requests", the context builders) and has no switch for all of them; its models' own
    ``disable_tqdm`` leaves the cache and task bars on. tqdm's ``TQDM_DISABLE`` is read once, when tqdm is
    imported (``tqdm.utils.envwrap``), so it cannot be set here. The class's ``__init__`` is restored on exit."""
    if not quiet:
        yield
        return
    from tqdm import std  # lazy: tqdm is imported with lm-eval anyway

    original = std.tqdm.__dict__["__init__"]

    def __init__(self, *args, **kwargs):
        if len(args) < 10:  # ``disable`` is tqdm's 11th parameter: nobody passes it by position
            kwargs["disable"] = True
        return original.__get__(self, type(self))(*args, **kwargs)

    std.tqdm.__init__ = __init__
    try:
        yield
    finally:
        std.tqdm.__init__ = original


@contextlib.contextmanager
def compiled_templates():
    """Within the block, lm-eval's ``utils.apply_template`` compiles each Jinja template once (its own compiles it
    again for every document: ``env.from_string(template)`` per call, 5 ms, most of the time it takes to build
    5-shot MMLU's requests); the same environment renders it, so the text is the same. Restored on exit."""
    import functools  # lazy

    import lm_eval.utils as utils  # lazy: loads lm_eval

    original = utils.apply_template
    compiled = functools.lru_cache(maxsize=1024)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    utils.apply_template = apply_template
    try:
        yield
    finally:
        utils.apply_template = original


@contextlib.contextmanager
def quiet_git_probe():
    """Within the block, lm-eval's evaluator runs its ``git describe --always`` probe (the ``git_hash`` of
    its results; lctx records its own ``git_rev``) with git's stderr silenced: outside a git repository
    git prints ``fatal: not a git repository`` on every lm-eval run. Same value as lm-eval's own
    ``get_git_commit_hash`` otherwise (its fallback reads ``.git`` by hand); restored on exit."""
    import lm_eval.evaluator as evaluator  # lazy: loads lm_eval
    from lm_eval.loggers.utils import get_commit_from_path  # lazy: loads lm_eval

    def get_git_commit_hash():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, OSError):
            return get_commit_from_path(os.getcwd())

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = get_git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original
