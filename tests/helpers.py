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
        ids = lm.with_bos(lm.encode("1 2 3 4 5 6 7 8 9 " * cell.length))[: cell.length]
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
        ids = lm.with_bos(lm.encode("hello world " * cell.length))[: cell.length]
        return Sample(cell=cell, input_ids=ids, n_tokens=len(ids))

    def score(self, lm, sample):
        nll, _ = lm.token_nll(sample.input_ids, [len(sample.input_ids) - 1])
        return {{"nll": float(nll[0])}}
'''
