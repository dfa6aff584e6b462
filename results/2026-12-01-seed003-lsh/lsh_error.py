"""Seed 003's error claim on a trained ALiBi checkpoint: how far positional LSH with s samples moves the
perplexity and the attention output from exact ALiBi, as a function of s.

    python results/2026-12-01-seed003-lsh/lsh_error.py CKPT TEXT --out DIR [--s 1,4,16,64] [--seeds 4]
        [--windows 128:32,512:8]

For each window size W:N (N non-overlapping windows of W tokens, BOS prepended, from the start of TEXT)
it computes, once with the checkpoint's exact ALiBi and then with its attention replaced by ``alibi_lsh``
(``lctx.models.adapters.overrides.apply_override``, the code behind ``lctx run --attn-override alibi_lsh:s=N``) for
each s and each LSH seed (``lsh_seed``: different fixed binnings):

- ppl: exp(mean next-token NLL over all tokens of the N windows);
- ppl_rel_err: |ppl_s - ppl_exact| / ppl_exact, per seed, then the mean over seeds;
- ppl_bias: (ppl_s - ppl_exact) / ppl_exact, mean over seeds (signed: the systematic part);
- out_rel_err: ||T~ - T*||_F / ||T*||_F of layer 0's attention output [B, H, T, D] (its inputs are the
  same for every s: the embeddings of the same tokens), mean over seeds: the quantity of seed 003's
  output-error bound (Theorem 2.2), expected to fall like 1/sqrt(s).

It writes DIR/lsh_error.csv (one row per W, s, seed) and DIR/lsh_error_summary.csv (means over seeds, with
the fitted exponent a of err ~ s^a per metric and W; seed 003 claims a = -1/2), and DIR/lsh_error.png.
Single-threaded unless OMP_NUM_THREADS says otherwise; the LSH attention runs lctx's plain PyTorch
reference (the checkpoint's attn_impl, never the exact-ALiBi dispatch of the CPU kernel).
"""

from __future__ import annotations

import argparse
import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lctx.models.adapters.hf import load_lm
from lctx.models.adapters.overrides import apply_override


def windows(lm, text: str, spec: str) -> dict[int, torch.Tensor]:
    """{W: [N, W] token ids}: BOS + W-1 text tokens per window, consecutive and non-overlapping."""
    ids = lm.encode(text)
    out = {}
    for part in spec.split(","):
        w, n = (int(x) for x in part.split(":"))
        rows = [[lm.bos_id] + ids[i * (w - 1):(i + 1) * (w - 1)] for i in range(n)]
        if len(rows[-1]) < w:
            raise SystemExit(f"error: {TEXT_HINT} has too few tokens for {n} windows of {w}")
        out[w] = torch.tensor(rows)
    return out


TEXT_HINT = "TEXT"


@torch.no_grad()
def measure(model, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(mean next-token NLL in nats, layer 0's attention output [B, H, T, D])."""
    got = {}
    hook = model.model.layers[0].attn.variant.register_forward_hook(lambda m, a, o: got.setdefault("o", o))
    try:
        logits = model(input_ids=x).logits.float()
    finally:
        hook.remove()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    return nll.item(), got["o"].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt")
    ap.add_argument("text")
    ap.add_argument("--out", required=True)
    ap.add_argument("--s", default="1,4,16,64")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--windows", default="128:32,512:8")
    a = ap.parse_args()
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    lm = load_lm(a.ckpt, device="cpu")
    if lm.model.config.variant != "alibi":
        raise SystemExit(f"error: {a.ckpt} is variant {lm.model.config.variant!r}; pass an ALiBi checkpoint")
    data = windows(lm, Path(a.text).read_text(encoding="utf-8"), a.windows)
    rows = []
    for w, x in data.items():
        nll0, o0 = measure(lm.model, x)
        rows.append(dict(window=w, s=0, seed=-1, ppl=math.exp(nll0), nll=nll0, out_rel_err=0.0))
        for s in (int(v) for v in a.s.split(",")):
            for seed in range(a.seeds):
                other = copy.copy(lm)
                other.model = copy.deepcopy(lm.model)
                apply_override(other, f"alibi_lsh:s={s},seed={seed}")
                nll, o = measure(other.model, x)
                rows.append(dict(window=w, s=s, seed=seed, ppl=math.exp(nll), nll=nll,
                                 out_rel_err=((o - o0).norm() / o0.norm()).item()))
                print(f"W={w} s={s} seed={seed}: ppl {math.exp(nll):.3f} (exact {math.exp(nll0):.3f}), "
                      f"layer-0 output rel err {rows[-1]['out_rel_err']:.4f}", flush=True)
    df = pd.DataFrame(rows)
    exact = df[df.s == 0].set_index("window").ppl
    df["ppl_exact"] = df.window.map(exact)
    df["ppl_bias"] = (df.ppl - df.ppl_exact) / df.ppl_exact
    df["ppl_rel_err"] = df.ppl_bias.abs()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "lsh_error.csv", index=False)
    lsh = df[df.s > 0]
    summ = lsh.groupby(["window", "s"]).agg(ppl=("ppl", "mean"), ppl_exact=("ppl_exact", "first"),
                                            ppl_bias=("ppl_bias", "mean"), ppl_rel_err=("ppl_rel_err", "mean"),
                                            out_rel_err=("out_rel_err", "mean")).reset_index()
    fits = []
    for w, g in summ.groupby("window"):
        for m in ("ppl_rel_err", "out_rel_err"):
            slope = np.polyfit(np.log(g.s), np.log(g[m]), 1)[0]
            fits.append(f"W={w}: {m} ~ s^{slope:.2f}")
    summ.to_csv(out / "lsh_error_summary.csv", index=False)
    (out / "lsh_error_fit.txt").write_text("\n".join(fits) + "\n(seed 003: O(1/sqrt(s)), exponent -0.5)\n")
    print(summ.to_string(index=False))
    print("\n".join(fits))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for w, g in summ.groupby("window"):
        ax.loglog(g.s, g.ppl_rel_err, "o-", label=f"|ppl - ppl_exact| / ppl_exact, W={w}")
        ax.loglog(g.s, g.out_rel_err, "s--", label=f"layer-0 output rel. error, W={w}")
    s = np.array(sorted(summ.s.unique()), dtype=float)
    ref = summ.out_rel_err.max()
    ax.loglog(s, ref * (s / s[0]) ** -0.5, "k:", label="1/sqrt(s) (seed 003)")
    ax.set_xlabel("LSH samples s")
    ax.set_ylabel("relative error vs exact ALiBi")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "lsh_error.png", dpi=120)


if __name__ == "__main__":
    main()
