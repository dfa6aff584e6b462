"""Next-token (top-1) accuracy of trained lctx checkpoints on a held-out text (RULES.md, claim 2: reported beside
passkey retrieval because seed 003 does not say its "accuracy" is retrieval).

    python token_acc.py HELDOUT.txt CKPT [CKPT ...] > token_acc.csv

Each checkpoint's own tokenizer reads the first TOKENS tokens of HELDOUT; they are cut into non-overlapping
windows of the model's training length, each window starts with BOS (as lctx's ppl task does, bos=prepend), and
every window position after BOS predicts the next token: accuracy = share of positions whose argmax is that
token; nll = their mean negative log-likelihood (nats). Evaluation mode (alibi_lsh: its fixed seeded bins)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import torch

TOKENS, BATCH = 16384, 16


def score(ckpt: Path, text: str) -> dict:
    """{"model", "window", "positions", "accuracy", "nll"} of one checkpoint folder."""
    import lctx.models  # noqa: F401  (registers the lctx model type)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    win = int(model.config.train_length)
    ids = tok(text, add_special_tokens=False)["input_ids"][:TOKENS]
    rows = [[tok.bos_token_id] + ids[i:i + win - 1] for i in range(0, len(ids) - win + 2, win - 1)]
    rows = [r for r in rows if len(r) == win]
    right, total, nll = 0, 0, 0.0
    with torch.no_grad():
        for b in range(0, len(rows), BATCH):
            x = torch.tensor(rows[b:b + BATCH])
            logits = model(x).logits[:, :-1].float()
            target = x[:, 1:]
            right += int((logits.argmax(-1) == target).sum())
            nll += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                           reduction="sum"))
            total += target.numel()
    return {"model": ckpt.name, "window": win, "positions": total, "accuracy": right / total, "nll": nll / total}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python token_acc.py HELDOUT.txt CKPT [CKPT ...]", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8")
    out = csv.DictWriter(sys.stdout, ["model", "window", "positions", "accuracy", "nll"])
    out.writeheader()
    for c in argv[1:]:
        out.writerow(score(Path(c), text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
