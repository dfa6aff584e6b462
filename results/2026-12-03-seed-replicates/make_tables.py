"""Tables and verdicts of results/2026-12-03-seed-replicates from its per-model files alone.

    python results/2026-12-03-seed-replicates/make_tables.py RUNS > results/2026-12-03-seed-replicates/tables.md
    python results/2026-12-03-seed-replicates/make_tables.py RUNS --check results/seeds.md   # exit 1 on a mismatch

RUNS holds one folder per trained model, ``<set>_<variant>_s<seed>/`` (run.sh copies them: ``summary.csv`` of the
lctx run, ``train_log.json``, and ``prior_params.csv`` for GGD models). Nothing here computes a score: each seed's
value of a cell is lctx's own mean over depths and samples (:func:`lctx.harness.run.tables.over_depths` on the
run's summary.csv, as `lctx run` prints it); across seeds this script only takes the mean, min and max, and a
claim's verdict is a stated rule applied to each seed separately (``CLAIMS`` below): "3 of 3" is reproduced,
"0 of 3" not, anything between is said as it is.

Verdict vocabulary (:func:`verdict`): *reproduced* / *not reproduced* / *mixed* over the seeds that learned the
task; *did not learn* when no seed learned it (a retrieval claim counts a seed as learned when its training probe
reached teacher-forced exact >= 0.8 and ``lctx run``'s passkey exact at 1x is >= 0.8; a model that never learned
retrieval is never counted as one that failed to extrapolate); *inconclusive at this scale* when only one of
several seeds learned, or the claim's control did not learn, so the comparison cannot show the effect.
Retrieval cells are split by needle depth: *far* pools depths 0-0.75 (the needle has filler between it and the
question), *near* is depth 1.0 (the needle next to the question); the claims are judged on far needles.

``--check SEEDS_MD``: the block between ``<!-- replicates:begin -->`` and ``<!-- replicates:end -->`` in SEEDS_MD
must equal :func:`claims_block` of RUNS (so every number in seeds.md's replicate table is the committed runs'),
else exit 1 with the first differing line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

NAME = re.compile(r"^(?P<set>[a-z]+)_(?P<variant>.+)_s(?P<seed>\d+)$")
BEGIN, END = "<!-- replicates:begin -->", "<!-- replicates:end -->"


DEPTH_GROUPS = {"far": lambda d: d < 1.0, "near": lambda d: d == 1.0}  # by needle depth (fraction of context)


def load(root: Path) -> pd.DataFrame:
    """One row per (set, variant, seed, task, metric, relative length, depths): the seed's value pooled over depths.

    Columns: set, variant, seed, task, metric, length (tokens), rel (length / training context), depths ("all";
    for cells measured per depth also "far", depths 0-0.75, and "near", depth 1.0), value, n, ci_low, ci_high.
    Raises FileNotFoundError when RUNS has no model folder."""
    from lctx.harness.run.tables import over_depths  # lazy: loads lctx's table code (torch-free)

    rows = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        m = NAME.match(d.name)
        if not m or not (d / "summary.csv").is_file():
            continue
        ctx = json.loads((d / "train_log.json").read_text())["args"]["context_length"]
        s = pd.read_csv(d / "summary.csv")
        s = s[s["length"].notna()].assign(model=d.name)
        parts = [("all", s)] + [(g, s[s["depth"].notna() & s["depth"].map(f)]) for g, f in DEPTH_GROUPS.items()]
        for group, part in parts:
            if part.empty:
                continue
            for r in over_depths(part).itertuples(index=False):
                rows.append(dict(set=m["set"], variant=m["variant"], seed=int(m["seed"]), task=r.task,
                                 metric=r.metric, length=int(r.length), rel=r.length / ctx, depths=group,
                                 value=float(r.mean), n=int(r.n), ci_low=r.ci_low, ci_high=r.ci_high))
    if not rows:
        raise FileNotFoundError(f"no <set>_<variant>_s<seed>/summary.csv under {root}")
    return pd.DataFrame(rows)


def probes(root: Path) -> dict:
    """{(set, variant, seed): the best teacher-forced passkey exact of the training probe} for the models whose
    train_log.json has a probe (retrieval in the training mix); others are absent."""
    out = {}
    for p in sorted(root.glob("*/train_log.json")):
        m = NAME.match(p.parent.name)
        ev = [e["passkey_tf_exact"] for e in json.loads(p.read_text()).get("evals", []) if "passkey_tf_exact" in e]
        if m and ev:
            out[(m["set"], m["variant"], int(m["seed"]))] = max(ev)
    return out


def priors(root: Path) -> pd.DataFrame:
    """Every GGD head's learned prior: set, variant, seed, layer, head, alpha, beta, fall_1nat (tokens)."""
    from lctx.models.bam import fall_distance_of  # lazy: loads torch (only for GGD priors)

    out = []
    for p in sorted(root.glob("*/prior_params.csv")):
        m = NAME.match(p.parent.name)
        if not m:
            continue
        f = pd.read_csv(p)
        if "fall_1nat" not in f.columns:
            f["fall_1nat"] = [fall_distance_of(a, b, u, k) for a, b, u, k in zip(f.alpha, f.beta, f.mu, f.form)]
        out.append(f.assign(set=m["set"], variant=m["variant"], seed=int(m["seed"])))
    return pd.concat(out) if out else pd.DataFrame()


def value(df, set_, variant, task, metric, rel, seed, depths="all"):
    """The seed's value of one cell (``depths``: "all", "far" or "near"), NaN when it was not run."""
    r = df[(df.set == set_) & (df.variant == variant) & (df.task == task) & (df.metric == metric)
           & (df.rel.round(3) == round(rel, 3)) & (df.seed == seed) & (df.depths == depths)]
    return float(r.value.iloc[0]) if len(r) else float("nan")


LEARN_BAR = 0.8  # retrieval learned: probe best and 1x passkey exact (all depths) at or above this
DID_NOT_LEARN = "did not learn"


def learned(df, probe, set_, variant, seed) -> bool:
    """Whether one seed learned retrieval: its training probe reached exact >= LEARN_BAR (when it had a probe)
    and its passkey exact at 1x over all depths is >= LEARN_BAR."""
    p = probe.get((set_, variant, seed), 1.0)
    one = value(df, set_, variant, "passkey", "exact", 1, seed)
    return p >= LEARN_BAR and _ok(one) and one >= LEARN_BAR


def spread(vals) -> str:
    """mean [min, max] (k seeds) of the finite values; "–" when none."""
    v = [x for x in vals if x == x]
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.3g} (1 seed)"
    return f"{sum(v) / len(v):.3g} [{min(v):.3g}, {max(v):.3g}] ({len(v)} seeds)"


def verdict(holds) -> str:
    """The claim's verdict from its per-seed results.

    ``holds``: one entry per seed, True / False (the rule holds or not), None (not run: not counted) or
    DID_NOT_LEARN (the seed never learned the task: counted apart, never as a failure); or a str, the verdict
    itself (a claim whose control did not learn says why it is inconclusive). Over the seeds that learned:
    "reproduced: k of k", "not reproduced: 0 of k", "mixed: j of k"; "did not learn" when none learned;
    "inconclusive at this scale" when only one of several seeds learned; "holds (1 seed)" / "does not hold
    (1 seed)" for a claim with one seed; "not run" when no seed ran."""
    if isinstance(holds, str):
        return holds
    h = [x for x in holds if x is not None]
    if not h:
        return "not run"
    ok = [x for x in h if x is not DID_NOT_LEARN]
    apart = f" ({len(h) - len(ok)} of {len(h)} did not learn)" if len(ok) < len(h) else ""
    if not ok:
        return f"did not learn: 0 of {len(h)} seeds learned the task"
    k = sum(ok)
    if len(h) == 1:
        return ("holds (1 seed)" if k else "does not hold (1 seed)") + f": {k} of 1"
    if len(ok) == 1:
        return f"inconclusive at this scale: 1 of {len(h)} seeds learned ({'holds' if k else 'does not hold'} in it)"
    word = "reproduced" if k == len(ok) else "not reproduced" if k == 0 else "mixed"
    return f"{word}: {k} of {len(ok)}{apart}"


def seeds_of(df, set_, variant):
    return sorted(df[(df.set == set_) & (df.variant == variant)].seed.unique())


def _ok(x) -> bool:
    return x == x


def _f(x, digits: int = 3) -> str:
    """x to ``digits`` significant digits, "–" for a cell not run (NaN)."""
    return f"{x:.{digits}g}" if _ok(x) else "–"


# Each claim: (label, the rule in words, a function (df, priors, probe) -> (cells text, [holds per seed] or a verdict))
def _learned_seeds(df, probe, set_, variant):
    """(seeds that learned retrieval, a note naming those that did not with their probe and 1x exact)."""
    ok, notes = [], []
    for s in seeds_of(df, set_, variant):
        if learned(df, probe, set_, variant, s):
            ok.append(s)
        else:
            notes.append(f"seed {s}: probe {probe.get((set_, variant, s), float('nan')):.2g}, "
                         f"1× {_f(value(df, set_, variant, 'passkey', 'exact', 1, s), 2)}")
    return ok, ("did not learn: " + "; ".join(notes) + "; ") if notes else ""


def _far_near(df, set_, variant, seeds, rels):
    """'far 16×: spread; ... | near 16×: spread; ...' of passkey exact over ``seeds``."""
    return " — ".join(f"{g} " + "; ".join(f"{r}×: " + spread([value(df, set_, variant, "passkey", "exact", r, s, g)
                                                              for s in seeds]) for r in rels)
                      for g in ("far", "near"))


def c_bam_retrieves(df, pr, probe):
    ok, note = _learned_seeds(df, probe, "bam", "ggd_bam")
    holds = []
    for s in seeds_of(df, "bam", "ggd_bam"):
        if s not in ok:
            holds.append(DID_NOT_LEARN)
            continue
        v = [value(df, "bam", "ggd_bam", "passkey", "exact", r, s, "far") for r in (1, 2, 4, 8, 16, 32, 64)]
        holds.append(min(v) >= 0.8 if all(map(_ok, v)) else None)
    return note + "ggd_bam passkey exact, learned seeds: " + _far_near(df, "bam", "ggd_bam", ok, (2, 4, 16, 64)), holds


def c_alibi_fails(df, pr, probe):
    ok, note = _learned_seeds(df, probe, "bam", "alibi")
    holds = []
    for s in seeds_of(df, "bam", "alibi"):
        a = value(df, "bam", "alibi", "passkey", "exact", 64, s, "far")
        holds.append(DID_NOT_LEARN if s not in ok else a <= 0.5 if _ok(a) else None)
    return note + "alibi passkey exact, learned seeds: " + _far_near(df, "bam", "alibi", ok, (4, 8, 32, 64)), holds


def c_beta(df, pr, probe):
    if pr.empty:
        return "no prior read", []
    g = pr[(pr.set == "bam") & (pr.variant == "ggd_bam")]
    holds, parts = [], []
    for s, h in g.groupby("seed"):
        holds.append(bool((h.beta <= 0).any()))
        lo = h.loc[h.beta.idxmin()]
        parts.append(f"seed {s}: β {h.beta.min():.2f}–{h.beta.max():.2f}, lowest-β head α {lo.alpha:.3g}, "
                     f"falls 1 nat at {lo.fall_1nat:.2g} tokens")
    return "; ".join(parts), holds


def c_bam_ppl(df, pr, probe):
    holds, gaps = [], []
    for s in seeds_of(df, "bam", "ggd_bam"):
        g, a = (value(df, "bam", v, "ppl", "ppl", 1, s) for v in ("ggd_bam", "alibi"))
        r = value(df, "bam", "ggd_bam", "flatness", "ppl_ratio", 64, s)
        gaps.append(g / a - 1 if _ok(g) and _ok(a) else float("nan"))
        holds.append(g <= 1.1 * a and r <= 1.1 if all(map(_ok, (g, a, r))) else None)
    return ("ppl at 1×: ggd_bam " + spread([value(df, "bam", "ggd_bam", "ppl", "ppl", 1, s)
                                            for s in seeds_of(df, "bam", "ggd_bam")])
            + ", alibi " + spread([value(df, "bam", "alibi", "ppl", "ppl", 1, s) for s in seeds_of(df, "bam", "alibi")])
            + "; ggd_bam / alibi − 1: " + spread(gaps) + "; ggd_bam ppl ratio at 64×: "
            + spread([value(df, "bam", "ggd_bam", "flatness", "ppl_ratio", 64, s)
                      for s in seeds_of(df, "bam", "ggd_bam")])), holds


def c_id_ppl(df, pr, probe):
    holds, gaps = [], []
    for s in seeds_of(df, "id", "interdomain"):
        i, q = (value(df, "id", v, "ppl", "ppl", 1, s) for v in ("interdomain", "s4d32"))
        gaps.append(1 - i / q if _ok(i) and _ok(q) else float("nan"))
        holds.append(i < q if _ok(i) and _ok(q) else None)
    return ("ppl at 1×: interdomain " + spread([value(df, "id", "interdomain", "ppl", "ppl", 1, s)
                                                for s in seeds_of(df, "id", "interdomain")])
            + ", S4D (32 modes) " + spread([value(df, "id", "s4d32", "ppl", "ppl", 1, s)
                                            for s in seeds_of(df, "id", "s4d32")])
            + "; interdomain lower by " + spread(gaps) + " (fraction)"), holds


def c_id_flat(df, pr, probe):
    holds = []
    for s in seeds_of(df, "id", "interdomain"):
        v = value(df, "id", "interdomain", "flatness", "ppl_ratio", 3.5, s)
        holds.append(v <= 1.1 if _ok(v) else None)
    txt = "; ".join(f"{v} ratio at {r}×: " + spread([value(df, "id", v, "flatness", "ppl_ratio", r, s)
                                                    for s in seeds_of(df, "id", v)])
                    for v in ("interdomain", "s4d32") for r in (3.5, 8))
    return txt + " (8× is past the seed's range: reported, not judged)", holds


def _per_spread(holds: list) -> str:
    """'holds in k of n at spread 0.25, k of n at 0.5' from a list ordered spread 0.25's seeds, then 0.5's."""
    h = len(holds) // 2
    a, b = [x for x in holds[:h] if x is not None], [x for x in holds[h:] if x is not None]
    return f"holds in {sum(a)} of {len(a)} seeds at spread 0.25, {sum(b)} of {len(b)} at 0.5"


def _rot(df, variant, rel):
    return [value(df, "rot", variant, "flatness", "ppl_ratio", rel, s) for s in seeds_of(df, "rot", variant)]


def c_rope_blows(df, pr, probe):
    holds = [v >= 1.5 if _ok(v) else None for v in _rot(df, "rope", 16)]
    return f"rope ratio at 16×: {spread(_rot(df, 'rope', 16))}; at 128×: {spread(_rot(df, 'rope', 128))}", holds


SEED004_ROPE_16X = 16.2  # the seed's RoPE ppl ratio at 16x (8K tokens, trained at 512)


def c_rope_magnitude(df, pr, probe):
    v = _rot(df, "rope", 16)
    holds = [x >= SEED004_ROPE_16X / 2 if _ok(x) else None for x in v]
    ok = [x for x in v if _ok(x)]
    times = f": {SEED004_ROPE_16X / (sum(ok) / len(ok)):.2g}× smaller on average" if ok else ""
    return f"rope ratio at 16×: {spread(v)}; the seed's: {SEED004_ROPE_16X}{times}", holds


def c_alibi_flat(df, pr, probe):
    holds = [v <= 1.1 if _ok(v) else None for v in _rot(df, "alibi", 128)]
    return f"alibi ratio at 128×: {spread(_rot(df, 'alibi', 128))}", holds


def c_rot_beats_rope(df, pr, probe):
    holds, parts = [], []
    for sp in ("0.25", "0.5"):
        for s in seeds_of(df, "rot", f"qk_sp{sp}"):
            a, r = value(df, "rot", f"qk_sp{sp}", "flatness", "ppl_ratio", 16, s), \
                value(df, "rot", "rope", "flatness", "ppl_ratio", 16, s)
            holds.append(a < r if _ok(a) and _ok(r) else None)
        parts.append(f"QK spread {sp} ratio at 16×: {spread(_rot(df, f'qk_sp{sp}', 16))}")
    return "; ".join(parts) + f" (rope {spread(_rot(df, 'rope', 16))}); {_per_spread(holds)}", holds


def c_values_help(df, pr, probe):
    holds, parts = [], []
    for sp in ("0.25", "0.5"):
        for s in seeds_of(df, "rot", f"qk_sp{sp}"):
            qk = value(df, "rot", f"qk_sp{sp}", "flatness", "ppl_ratio", 128, s)
            qkv = value(df, "rot", f"qkv_sp{sp}", "flatness", "ppl_ratio", 128, s)
            holds.append(qkv < qk if _ok(qk) and _ok(qkv) else None)
        parts.append(f"spread {sp} at 128×: QK {spread(_rot(df, f'qk_sp{sp}', 128))}, "
                     f"QK+V {spread(_rot(df, f'qkv_sp{sp}', 128))}")
    return "; ".join(parts) + f"; {_per_spread(holds)}", holds


def c_rot_degrades(df, pr, probe):
    holds = []
    for sp in ("0.25", "0.5"):
        for s in seeds_of(df, "rot", f"qk_sp{sp}"):
            a, b = (value(df, "rot", f"qk_sp{sp}", "flatness", "ppl_ratio", r, s) for r in (16, 128))
            holds.append(b > a if _ok(a) and _ok(b) else None)
    return ("QK ratio 16× → 128×: spread 0.25 " + spread(_rot(df, "qk_sp0.25", 16)) + " → "
            + spread(_rot(df, "qk_sp0.25", 128)) + "; spread 0.5 " + spread(_rot(df, "qk_sp0.5", 16)) + " → "
            + spread(_rot(df, "qk_sp0.5", 128)) + f"; {_per_spread(holds)}"), holds


def c_lsh(df, pr, probe):
    lsh, ali = (value(df, "lsh", v, "passkey", "exact", 1, 0) for v in ("alibi_lsh_s16", "alibi"))
    pl, pa = (value(df, "lsh", v, "ppl", "ppl", 1, 0) for v in ("alibi_lsh_s16", "alibi"))
    holds = [lsh >= 0.8 * ali and pl <= 1.1 * pa] if all(map(_ok, (lsh, ali, pl, pa))) else []
    text = (f"seed 0, passkey exact at 1×: alibi_lsh s=16 {_f(lsh)}, alibi {_f(ali)}; ppl at 1×: {_f(pl, 4)} vs "
            f"{_f(pa, 4)}")
    if _ok(ali) and not learned(df, probe, "lsh", "alibi", 0):  # "keeps" the accuracy of a control that has none
        return text, "inconclusive at this scale: the control (exact ALiBi) did not learn retrieval on this recipe"
    return text, holds


def c_once(df, pr, probe):
    p16, p128 = (value(df, "rot", "path", "flatness", "ppl_ratio", r, 0) for r in (16, 128))
    r16 = value(df, "rot", "rope", "flatness", "ppl_ratio", 16, 0)
    si = [value(df, "bam", "sinusoidal", "passkey", "exact", r, 0) for r in (1, 2, 4)]
    ip = [value(df, "bam", "interdomain", "passkey", "exact", r, 0) for r in (1, 2, 4)]
    holds = [p16 < r16] if _ok(p16) and _ok(r16) else []
    return (f"PaTH ratio {_f(p16)} at 16×, {_f(p128)} at 128× (rope seed 0: {_f(r16)} at 16×); sinusoidal passkey "
            f"exact at 1×/2×/4×: {'/'.join(_f(x, 2) for x in si)}; interdomain on the passkey recipe: "
            f"{'/'.join(_f(x, 2) for x in ip)}"), holds


CLAIMS = [
    ("000: GGD-BAM (without SSMax) retrieves far past training",
     "learned seeds: far-needle passkey exact ≥ 0.8 at every length 1×–64×", c_bam_retrieves),
    ("000: ALiBi fails at retrieval at extreme lengths", "learned seeds: alibi far-needle passkey exact ≤ 0.5 at 64×",
     c_alibi_fails),
    ("000: heads learn β ≤ 0", "some ggd_bam head has β ≤ 0", c_beta),
    ("000: GGD-BAM's ppl comparable to ALiBi", "ggd_bam ppl at 1× ≤ 1.1 × alibi's (same seed) and ratio ≤ 1.1 at 64×",
     c_bam_ppl),
    ("002: interdomain has lower ppl than S4D (state matched)", "interdomain ppl at 1× < S4D (32 modes) ppl, same seed",
     c_id_ppl),
    ("002: interdomain is flat in length (the seed: to 3.5×)", "interdomain ppl ratio ≤ 1.1 at 3.5×", c_id_flat),
    ("004: RoPE's ppl blows up past training (direction)", "rope ppl ratio ≥ 1.5 at 16×", c_rope_blows),
    ("004: RoPE's blow-up as large as the seed's (16.2× at 16×)", "rope ppl ratio at 16× ≥ 8.1 (half the seed's)",
     c_rope_magnitude),
    ("004: ALiBi stays flat", "alibi ppl ratio ≤ 1.1 at 128×", c_alibi_flat),
    ("004: random accumulated rotations extrapolate better than RoPE",
     "acc_rot QK ratio at 16× < rope's (same seed), each spread", c_rot_beats_rope),
    ("004: rotating values too helps further", "QK+V ratio at 128× < QK ratio (same seed and spread)", c_values_help),
    ("004: rotation-only models degrade at extreme length", "QK ratio at 128× > at 16× (same seed and spread)",
     c_rot_degrades),
    ("003: LSH trained with retrieval in the mix keeps ALiBi's accuracy and ppl",
     "alibi_lsh s=16 passkey exact at 1× ≥ 0.8 × alibi's and ppl ≤ 1.1 × alibi's (half-retrieval mix, 2000 steps; "
     "the seed does not say its accuracy is retrieval)",
     c_lsh),
    ("PaTH / sinusoidal / interdomain on retrieval (trained once)", "PaTH ratio at 16× < rope's (seed 0)", c_once),
]


def claims_block(root: Path, claims=None, begin: str = BEGIN, end: str = END) -> str:
    """The claims table (Markdown) that seeds.md carries verbatim between ``begin`` and ``end``: one row per
    (label, rule, function) of ``claims`` (default :data:`CLAIMS`), each function called as (df, priors, probe)
    on RUNS."""
    df, pr, probe = load(root), priors(root), probes(root)
    lines = [begin, "", "| claim | rule (per seed) | our numbers: mean [min, max] over seeds | verdict |",
             "|---|---|---|---|"]
    for label, rule, fn in claims or CLAIMS:
        text, holds = fn(df, pr, probe)
        lines.append(f"| {label} | {rule} | {text} | {verdict(holds)} |")
    return "\n".join(lines + ["", end])


def cell_tables(root: Path) -> str:
    """Per set and headline metric: variant x relative length, mean [min, max] (seeds); passkey exact also for
    far needles (depths 0-0.75) and the near one (depth 1.0) apart."""
    df = load(root)
    heads = [("passkey", "exact", "all"), ("passkey", "exact", "far"), ("passkey", "exact", "near"),
             ("passkey", "digit_acc", "all"), ("flatness", "ppl_ratio", "all"), ("flatness", "ppl_ratio_low", "all"),
             ("flatness", "ppl_ratio_high", "all"), ("ppl", "ppl", "all")]
    out = []
    for set_, g in df.groupby("set", sort=False):
        windows = (g.metric == "ppl_ratio_high").any()  # ppl.windows=N: the ratio pools windows by nll
        for task, metric, depths in heads:
            h = g[(g.task == task) & (g.metric == metric) & (g.depths == depths)]
            if h.empty:
                continue
            if windows and (task, metric) == ("ppl", "ppl"):  # the mean of the windows' ppl, not the pooled one
                out += [f"({set_}: ppl left out: in windows mode lctx's ppl cell is the mean of the windows' "
                        "perplexities, while ppl_ratio and its interval pool them by nll)", ""]
                continue
            rels = sorted(h.rel.unique())
            which = {"all": "", "far": ", far needles (depths 0-0.75)", "near": ", near needle (depth 1.0)"}[depths]
            out += [f"### {set_}: {task} {metric}{which}", "",
                    "| variant | " + " | ".join(f"{r:g}×" for r in rels) + " |", "|---|" + "---|" * len(rels)]
            for v, hv in h.groupby("variant"):
                out.append(f"| {v} | " + " | ".join(spread(list(hv[hv.rel == r].sort_values("seed").value))
                                                    for r in rels) + " |")
            out.append("")
    return "\n".join(out)


def code_revisions(root: Path) -> str:
    """Which lctx revision each model's evaluation ran with (run.json's ``git_rev``, ``-dirty`` = uncommitted
    changes) and its training (train_log.json's ``git_rev``: "not recorded" for logs written before train
    recorded it): a Markdown table, one row per revision pair, naming its models."""
    groups: dict = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and NAME.match(p.name)):
        ev = json.loads((d / "run.json").read_text()).get("git_rev", "not recorded") if (d / "run.json").is_file() \
            else "no run.json"
        tr = json.loads((d / "train_log.json").read_text()).get("git_rev", "not recorded")
        groups.setdefault((ev, tr), []).append(d.name)
    lines = ["| evaluated with | trained with | models |", "|---|---|---|"]
    lines += [f"| `{ev}` | {tr} | {', '.join(ms)} |" for (ev, tr), ms in sorted(groups.items())]
    return "\n".join(lines)


def check(root: Path, md: Path, claims=None, begin: str = BEGIN, end: str = END) -> int:
    """0 when md's block between ``begin`` and ``end`` equals claims_block(root, claims, begin, end), else 1 (the
    first differing line printed)."""
    text = md.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        print(f"error: {md} has no {begin} ... {end} block", file=sys.stderr)
        return 1
    have = text[text.index(begin):text.index(end) + len(end)].splitlines()
    want = claims_block(root, claims, begin, end).splitlines()
    for i, (a, b) in enumerate(zip(have, want)):
        if a != b:
            print(f"error: {md}, the {begin} block, line {i + 1}, differs from the runs:\n  has:  {a}\n  runs: {b}",
                  file=sys.stderr)
            return 1
    if len(have) != len(want):
        print(f"error: {md}'s {begin} block has {len(have)} lines, the runs give {len(want)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--check", type=Path, help="seeds.md whose replicate block must match the runs")
    a = ap.parse_args(argv)
    if a.check:
        return check(a.runs, a.check)
    print("<!-- made by make_tables.py from runs/; do not edit -->\n")
    print("## Claims\n\n" + claims_block(a.runs) + "\n")
    print("## Cells: mean [min, max] over seeds of each seed's mean over depths and samples\n")
    print(cell_tables(a.runs))
    print("## Code each model ran with (run.json, train_log.json)\n")
    print(code_revisions(a.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
