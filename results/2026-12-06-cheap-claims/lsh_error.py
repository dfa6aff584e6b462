"""Seed 003's approximation error against the number of binnings s (RULES.md, claim 1): the sample-mean mask
M~ = (1/s) sum_r M_r of :func:`lctx.models.lsh.sample_bins` binnings against the ALiBi kernel
L*_ij = exp(-m |i - j|) over positions 0..N-1, in spectral norm (largest singular value of M~ - L*) and max
norm (largest |entry|), for the slopes of a 4-head model (:func:`lctx.models.alibi_slopes`).

    python lsh_error.py > lsh_error.csv      # one row per (head, s, draw); then tables.py fits the slopes

Seconds on one CPU core. Draw d of sample count s uses generator seed 1000 * s + d."""

from __future__ import annotations

import csv
import sys

import torch

from lctx.models import alibi_slopes
from lctx.models.lsh import bin_mask_mean, sample_bins

N, DRAWS, SAMPLES = 512, 20, (1, 4, 16, 64, 256)


def main() -> int:
    slopes = alibi_slopes(4).double()
    d = (torch.arange(N)[:, None] - torch.arange(N)[None, :]).abs().double()
    exact = torch.exp(-d[None] * slopes[:, None, None])  # [H, N, N]
    out = csv.writer(sys.stdout)
    out.writerow(["head", "slope", "n", "s", "draw", "spectral", "max"])
    for s in SAMPLES:
        for draw in range(DRAWS):
            w, u = sample_bins(slopes, s, torch.Generator().manual_seed(1000 * s + draw))
            err = bin_mask_mean(N, w, u) - exact
            spec = torch.linalg.matrix_norm(err, ord=2)  # [H]
            mx = err.abs().amax(dim=(-1, -2))
            for h in range(len(slopes)):
                out.writerow([h, f"{slopes[h].item():.6g}", N, s, draw, f"{spec[h].item():.6g}", f"{mx[h].item():.6g}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
