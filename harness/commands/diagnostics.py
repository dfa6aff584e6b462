"""Diagnostics the seeds rely on: learned GGD-BAM prior shapes (seed 000) and attention far-mass (seed 004).

- :func:`prior_table` / :func:`plot_priors`: each head's learned prior exp(b(d)) against distance d,
  coloured by beta (seed 000's interpretability claim: beta <= 0 heads suppress local context).
- :func:`far_mass`: the share of attention mass that queries put on keys farther than ``distance``
  tokens, as the context grows (seed 004's near/far mass; its lower bound says this share tends to 1
  under a full softmax with bounded logits unless something, e.g. a distance bias, controls it).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from transformers.cache_utils import DynamicCache

from lctx.errors import LctxError
from lctx.models.bam import GGDPrior, fall_distance

from lctx.models.adapters.hf import HFAdapter


def _priors(lm: HFAdapter):
    """[(layer or "shared", GGDPrior)] of a ggd_bam checkpoint.

    Raises:
        LctxError: the model has no GGD prior.
    """

    m = lm.model.model
    found = []
    if isinstance(getattr(m, "variant_shared", None), GGDPrior):
        found.append(("shared", m.variant_shared))
    for i, blk in enumerate(getattr(m, "layers", [])):
        prior = getattr(blk.attn.variant, "prior", None)
        if isinstance(prior, GGDPrior):
            found.append((i, prior))
    if not found:
        raise LctxError(f"model {lm.name!r} (variant {lm.variant}) has no GGD-BAM prior; "
                        "prior shapes need a ggd_bam checkpoint")
    return found


def prior_table(lm: HFAdapter, delta: float = 1.0) -> pd.DataFrame:
    """One row per (layer, head): alpha (tokens; 1/alpha = e^theta_alpha), beta, mu (tokens) of the learned
    GGD prior, its ``form`` (``reference``: b = -(1/alpha) (|j-i-mu| + eps)^beta; ``paper``/``legacy``:
    b = -(|(j-i-mu)/alpha| + eps)^beta, see :mod:`lctx.models.bam`) and ``fall_1nat`` (with ``delta`` other
    than 1: ``fall_<delta>nat``): the distance in tokens at which the bias has fallen ``delta`` nats below its
    peak (:func:`lctx.models.bam.fall_distance`; inf for beta <= 0), a length for any beta where alpha is one
    only at beta = 1.

    Raises:
        LctxError: not a ggd_bam checkpoint.
    """
    col = "fall_1nat" if delta == 1.0 else f"fall_{delta:g}nat"
    rows = []
    for layer, p in _priors(lm):
        amp, ainv, beta, mu_k = (t.detach().double().tolist() for t in p.kernel_params())
        for h, (a, b, mu) in enumerate(zip(p.alpha.detach().tolist(), p.beta.detach().tolist(), p.mu.detach().tolist())):
            rows.append({"model": lm.name, "layer": layer, "head": h, "alpha": a, "beta": b, "mu": mu,
                         "form": getattr(p, "form", "legacy"),
                         col: fall_distance(amp[h], ainv[h], beta[h], mu_k[h], p.eps, delta)})
    return pd.DataFrame(rows)


def plot_priors(lm: HFAdapter, out_dir: Path, max_distance: int | None = None) -> Path:
    """Write ``plots/prior_shapes_<model>.png``: exp(b(d)) for d = 0..max_distance (default 8x the
    training length) per head, log-log, one panel per prior (shared, or each layer), lines coloured by
    beta (blue: beta <= 0 inverted prior, red: beta >= 1 ALiBi-like). Returns the path.

    Raises:
        LctxError: not a ggd_bam checkpoint.
    """
    import matplotlib  # lazy: loads matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib
    from matplotlib import cm, colors  # lazy: loads matplotlib

    priors = _priors(lm)
    D = max_distance or 8 * (lm.train_length or 512)
    d = torch.arange(0, D + 1)
    norm = colors.TwoSlopeNorm(vmin=-1.0, vcenter=0.5, vmax=1.5)
    cmap = cm.coolwarm
    fig, axes = plt.subplots(1, len(priors), figsize=(5.2 * len(priors), 4.2), squeeze=False)
    for ax, (layer, p) in zip(axes[0], priors):
        with torch.no_grad():
            b = p(torch.tensor([[D]]), (D - d)[None])[0, :, 0]  # query at D, key at D - d: [H, D + 1]
        for h in range(b.shape[0]):
            beta = float(p.beta[h].detach())
            ax.plot(d[1:].numpy(), torch.exp(b[h, 1:].double()).numpy(), color=cmap(norm(max(-1, min(1.5, beta)))),
                    label=f"h{h}: beta={beta:.2f}, alpha={float(p.alpha[h].detach()):.1f}")
        if lm.train_length:
            ax.axvline(lm.train_length, ls="--", color="grey", lw=1)
            ax.text(lm.train_length, 1.02, "train length", transform=ax.get_xaxis_transform(), ha="center",
                    fontsize=8, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-12)
        ax.set_xlabel("distance i - j (tokens)")
        ax.set_ylabel("prior exp(b(d)) (unnormalised)")
        ax.set_title(f"layer {layer}" if layer != "shared" else "shared prior (all layers)")
        ax.grid(alpha=0.3, which="both")
        if b.shape[0] <= 12:
            ax.legend(fontsize=7, loc="lower left")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[0].tolist(), label="beta (shape)")
    fig.suptitle(f"Learned GGD-BAM priors: {lm.name}")
    out = Path(out_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"prior_shapes_{_safe(lm.name)}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


@torch.inference_mode()
def far_mass(lm: HFAdapter, ids: list[int], lengths: list[int], distance: int, n_queries: int = 32) -> pd.DataFrame:
    """Attention mass beyond ``distance`` tokens, per (layer, head, length).

    For each length L, the first L tokens of ``ids`` are prefilled (in ``lm.chunk_size`` chunks) and
    the last ``n_queries`` queries are run with an attention probe; far mass of query i is
    sum over keys j with i - j > distance of a_ij, averaged over those queries. Only native lctx models
    whose variant uses softmax attention (every variant built on ``AttentionVariant.attend``) qualify.

    Returns a tidy DataFrame: model, variant, layer, head, length, distance, far_mass (in [0, 1]).

    Raises:
        LctxError: ``ids`` shorter than a length, or the model exposes no attention weights.
    """

    rows = []
    for L in lengths:
        if len(ids) < L:
            raise LctxError(f"far-mass needs {L} tokens of text but the data has {len(ids)}; "
                            "pass a longer --data file or smaller --lengths")
        x = torch.tensor(ids[:L], device=lm.device)[None]
        nq = min(n_queries, L)
        cache = DynamicCache()
        for s in range(0, L - nq, lm.chunk_size):
            e = min(s + lm.chunk_size, L - nq)
            lm.model(input_ids=x[:, s:e], cache=cache, use_cache=True, logits_to_keep=1)
        got: dict[int, torch.Tensor] = {}

        def probe(layer_idx, probs, ctx):
            d = ctx.q_pos[:, :, None] - ctx.k_pos[:, None, :]  # [B, Tq, Tk]
            far = (probs * (d > distance)[:, None].to(probs.dtype)).sum(-1)  # [B, H, Tq]
            got[layer_idx] = far.mean(dim=(0, 2)).cpu()

        try:
            lm.model(input_ids=x[:, L - nq:], cache=cache, use_cache=True, logits_to_keep=1, attn_probe=probe)
        except TypeError:
            got = {}
        if not got:
            raise LctxError(f"model {lm.name!r} (variant {lm.variant}) exposes no softmax attention weights; "
                            "far-mass needs a native lctx softmax variant (rope, alibi, ggd_bam, acc_rot, ...)")
        for layer, fm in sorted(got.items()):
            for h, v in enumerate(fm.tolist()):
                rows.append({"model": lm.name, "variant": lm.variant, "layer": layer, "head": h, "length": L,
                             "distance": distance, "far_mass": v, "train_length": lm.train_length})
    return pd.DataFrame(rows)


def plot_far_mass(df: pd.DataFrame, out_dir: Path) -> Path:
    """Write ``plots/far_mass.png``: mean far mass over heads and layers vs length (log2 x), one line per
    model, with the per-layer spread shaded; the training length is marked when known. Returns the path."""
    import matplotlib  # lazy: loads matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for model, g in df.groupby("model", sort=True):
        per_layer = g.groupby(["length", "layer"])["far_mass"].mean().unstack("layer")
        mean = per_layer.mean(axis=1)
        line, = ax.plot(mean.index, mean.values, marker="o", label=f"{model} ({g['variant'].iloc[0]})")
        ax.fill_between(per_layer.index, per_layer.min(axis=1), per_layer.max(axis=1), alpha=0.15,
                        color=line.get_color())
        if "train_length" in g and g["train_length"].notna().any():
            ax.axvline(float(g["train_length"].dropna().iloc[0]), ls="--", color=line.get_color(), lw=1)
    ax.set_xscale("log", base=2)
    lengths = sorted(df["length"].unique())
    ax.set_xticks(lengths, [f"{L // 1024}K" if L >= 1024 and L % 1024 == 0 else str(L) for L in lengths])
    ax.set_ylim(0, 1)
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.set_ylabel(f"attention mass beyond {int(df['distance'].iloc[0])} tokens")
    ax.set_title("Far attention mass vs context length (mean over heads; band: layers)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(out_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "far_mass.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name))
