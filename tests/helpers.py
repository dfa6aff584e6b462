"""Small helpers shared by the tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations


def tiny_config(variant: str, **kw):
    from lctx.models import LctxConfig

    args = dict(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, variant=variant,
                train_length=64)
    args.update(kw)
    return LctxConfig(**args)


def run_cli(args, capsys):
    """Run ``lctx`` in-process with ``args`` (converted to str); returns (exit code, stdout, stderr)."""
    from lctx.cli import main

    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def digit_copy_task_source() -> str:
    """The source of a custom retrieval task (a ``--task-file``) that declares its metadata: ``digit_copy``, metrics
    ``copy_top1`` (the headline, though ``copy_nll`` sorts first) and ``copy_nll``, a direction for each,
    ``retrieval = True``, a depth axis; it scores the last token of a run of digits (top-1 hit and NLL,
    :meth:`lctx.models.adapters.hf.HFAdapter.token_nll`)."""
    return '''
from lctx.tasks import Task, Sample, register_task

@register_task
class DigitCopy(Task):
    name = "digit_copy"
    axes = ("depth", "sample")
    metrics = ("copy_top1", "copy_nll")
    headline_metric = "copy_top1"
    higher_is_better = {"copy_top1": True, "copy_nll": False}
    retrieval = True

    def build(self, lm, cell, seed):
        ids = ([lm.bos_id] if lm.bos_id is not None else []) + lm.encode("1 2 3 4 5 6 7 8 9 " * cell.length)
        ids = ids[: cell.length]  # the protocol's members only (bos_id, encode): runs on any adapter
        return Sample(cell=cell, input_ids=ids, n_tokens=len(ids), depth=cell.depth)

    def score(self, lm, sample):
        nll, top1 = lm.token_nll(sample.input_ids, [len(sample.input_ids) - 1])
        return {"copy_top1": float(top1[0]), "copy_nll": float(nll[0])}
'''


#: What ``run.json`` records of :func:`digit_copy_task_source`'s task (``task_meta``,
#: :meth:`lctx.tasks.Task.declaration`).
DIGIT_COPY_META = {"name": "digit_copy", "version": 1, "metrics": ["copy_top1", "copy_nll"],
                   "headline_metric": "copy_top1", "higher_is_better": {"copy_top1": True, "copy_nll": False},
                   "retrieval": True, "secondary_metric": None, "axes": ["depth", "sample"], "uses_seed": True,
                   "heatmap_metrics": None}


def assert_one_line_error(code, err, *needles):
    """A user mistake: exit 2, exactly one stderr line starting with "error: ", no traceback, and each of
    ``needles`` in that line."""
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def write_niah_data(root):
    """A RULER-shaped data folder under ``root``: ``ruler/PaulGrahamEssays.json`` (150 sentences, every third
    a question, 1.2k words) and two short wonderwords lists; returns ``root``."""
    import json

    (root / "ruler" / "wonderwords").mkdir(parents=True)
    sents = [f"Sentence {i} tells a short story about the sea." if i % 3 else f"Is this line {i} a question?"
             for i in range(150)]
    (root / "ruler" / "PaulGrahamEssays.json").write_text(json.dumps({"text": "  ".join(sents) + "\n"}))
    (root / "ruler" / "wonderwords" / "adjectivelist.txt").write_text("quick\nlazy\ngreen\nbold\nshy\n")
    (root / "ruler" / "wonderwords" / "nounlist.txt").write_text("fox\ndog\nriver\nstone\ncloud\nlamp\n")
    return root


def tiny_lm(path, tokenizer, variant: str = "rope"):
    """A random-init (seed 0) 2-layer lctx model with ``tokenizer``, saved to ``path`` and loaded as an LM."""
    import torch

    from lctx.models.adapters.hf import load_lm
    from lctx.models import LctxForCausalLM

    torch.manual_seed(0)
    LctxForCausalLM(tiny_config(variant, vocab_size=len(tokenizer))).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_lm(str(path), device="cpu")


def token_nll_task_source(cls: str, name: str) -> str:
    """The source of a small custom task (a ``--task-file``): the nll of the last token of "hello world ..."
    at the cell's length; task ``name``, class ``cls``."""
    return f'''
from lctx.tasks import Task, Sample, register_task

@register_task
class {cls}(Task):
    name = "{name}"
    metrics = ("nll",)

    def build(self, lm, cell, seed):
        ids = ([lm.bos_id] if lm.bos_id is not None else []) + lm.encode("hello world " * cell.length)
        ids = ids[: cell.length]
        return Sample(cell=cell, input_ids=ids, n_tokens=len(ids))

    def score(self, lm, sample):
        nll, _ = lm.token_nll(sample.input_ids, [len(sample.input_ids) - 1])
        return {{"nll": float(nll[0])}}
'''


# --- run directories built by the runner (issue 10's tests: the resume key, damaged files, forged records) -------

#: A short English text for ppl (the ``data`` fixture of conftest.py writes it to a file).
TEXT = ("The module documents every function it exports. A function takes arguments and returns a value; "
        "the value may be None when nothing is returned. Each example below shows a call and its result. ") * 12


def ppl_task(data, **kw):
    """A ppl task on the text file ``data`` (options ``kw``)."""
    from lctx.tasks.ppl import Perplexity

    return Perplexity(data=[str(data)], **kw)


def sweep(ck, tasks, out, lengths=(64,), depths=(0.5,), samples=1, **kw):
    """``run_sweep`` of checkpoint ``ck`` freshly loaded (``kw`` to load_lm) on ``tasks`` into ``out``."""
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(ck), device="cpu", **kw)  # a fresh load, as a new `lctx run` process does
    return run_sweep([lm], tasks, RunSpec(list(lengths), list(depths), samples), out, progress=False)


def value(res, task, metric):
    """The values of ``task``'s ``metric`` in a sweep result's table."""
    t = res["table"]
    return t[(t["task"] == task) & (t["metric"] == metric)]["value"].tolist()


def base_run(make_checkpoint, tmp_path, capsys, samples=1):
    """One finished ``lctx run`` (passkey, 160 tokens, depth 0.5) into ``tmp_path / "o"``: (out, its argv)."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    args = ["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--depths", "0.5", "--samples", samples,
            "--out", out, "--no-progress"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    return out, args


def _records(out):
    """The records of run directory ``out`` (records.jsonl, blank lines skipped)."""
    import json

    return [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines() if ln.strip()]


def _left_out(err: str) -> list[str]:
    """The lines of ``err`` that name records left out of the tables (issue 25 item 2)."""
    return [x for x in err.splitlines() if "left out of the tables" in x]


# --- damaged checkpoints ------------------------------------------------------------------------------------------

def nan_checkpoint(make_checkpoint, how: str):
    """A rope checkpoint whose layer 0 is NaN (``how="layer0"``) or with one embedding row inf (otherwise)."""
    import torch
    from safetensors.torch import load_file, save_file

    ck = make_checkpoint("rope", name=f"nan_{how}")
    t = load_file(ck / "model.safetensors")
    if how == "layer0":
        for k in t:
            if k.startswith("model.layers.0."):
                t[k] = torch.full_like(t[k], float("nan"))
    else:  # one embedding row to inf (tied to the output: every logit row sees it)
        key = next(k for k in t if "embed_tokens" in k)
        t[key][5] = float("inf")
    save_file(t, ck / "model.safetensors", metadata={"format": "pt"})
    return ck


def edited_checkpoint(make_checkpoint, **changes):
    """A rope checkpoint named "edited" whose config.json has ``changes``."""
    import json

    ck = make_checkpoint("rope", name="edited")
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(changes)
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


# --- RULER-shaped data folders ------------------------------------------------------------------------------------

def ruler_data(root, text: str):
    """``root/ruler``: an essay of ``text`` and four-word adjective and noun lists; returns ``root``."""
    import json

    (root / "ruler" / "wonderwords").mkdir(parents=True)
    (root / "ruler" / "PaulGrahamEssays.json").write_text(json.dumps({"text": text}))
    (root / "ruler" / "wonderwords" / "adjectivelist.txt").write_text("quick\nlazy\ngreen\nbold\n")
    (root / "ruler" / "wonderwords" / "nounlist.txt").write_text("fox\ndog\nriver\nstone\n")
    return root


def ruler_qa_data(root):
    """ruler_data's essay and word lists plus RULER's verb list and a SQuAD dev file (tests/ruler_fixtures.py)."""
    from ruler_fixtures import write_squad

    ruler_data(root, " ".join(f"Sentence {i} tells a short story about the sea." for i in range(200)))
    (root / "ruler" / "wonderwords" / "verblist.txt").write_text("run\nswim\nfly\nread\n")
    write_squad(root / "squad" / "dev-v2.0.json", 2, 2)
    return root


# --- what a task feeds the model ----------------------------------------------------------------------------------

def _forward_work(monkeypatch, lm) -> list[float]:
    """Record every forward call's work in prefill tokens: its tokens, and at least a decode step's worth
    (DECODE_STEP_TOKENS) for a call of a few tokens, whose cost is the call, not its tokens."""
    from lctx.tasks.base import DECODE_STEP_TOKENS

    work: list[float] = []
    orig = lm._forward

    def counting(ids, cache, keep, *mask):
        work.append(max(int(ids.shape[-1]), DECODE_STEP_TOKENS))
        return orig(ids, cache, keep, *mask)

    monkeypatch.setattr(lm, "_forward", counting)
    return work
