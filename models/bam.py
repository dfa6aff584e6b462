"""Seed 000 (Bianchessi et al., "Bayesian Attention Mechanism", arXiv 2505.22842; reference code
github.com/ArthurSBianchessi/BAM, ``models/bam_ssmax.py``): the GGD-BAM positional prior and
Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399).

``ggd_bam``: logit bias b_ij = -(|(i - j - mu) / alpha_h| + eps)^beta_h for keys j <= i. Per head two
unconstrained parameters: theta_alpha = log(1/alpha_h) and beta_h itself (any real: beta in (0, 1) is a
heavy tail, beta <= 0 the inverted prior); mu = 2 sinh(theta_mu) is fixed at 0 unless
``variant_options["ggd_learn_mu"]``. Initialised as ALiBi (beta = 1, 1/alpha = the ALiBi slope), like
the reference. The j = i term: as in the reference, eps = 1e-5 is added to |.| before the power, so
for beta < 0 the bias at distance 0 is -(1e-5)^beta (finite, -316 at beta = -0.5: the query's own token
is suppressed) and for beta = 1 the whole row shifts by -eps, which the softmax removes.

``+ssmax``: the content logits of query i are multiplied by s_h log(n_i), n_i = i + 1 keys visible from
the start of its document (decode steps: the cache length); s_h learnable per head, initialised to 1.
The reference code scales q k^T / sqrt(D) only and adds the prior afterwards (``scores * section_log_len
* seq_scale`` then ``+ prior``); that is the default here. ``variant_options["ssmax_scale_bias"] = True``
scales the bias as well.
"""

from __future__ import annotations

import torch
from torch import nn

from .variants import AttentionVariant, AttnContext, alibi_slopes, register_modifier, register_variant


class GGDPrior(nn.Module):
    """GGD positional prior, per head: b(d) = -(|(d - mu) / alpha| + eps)^beta for distance d = i - j.

    Parameters (each [H]): ``theta_alpha`` (alpha = exp(-theta_alpha)), ``beta``, ``theta_mu``
    (mu = 2 sinh(theta_mu); frozen unless ``learn_mu``). Forward: q_pos [B, Tq], k_pos [B, Tk] ->
    bias [B, H, Tq, Tk] float32. Memory O(Tq * Tk) per head (the fast path computes it in-kernel).
    """

    def __init__(self, n_heads: int, learn_mu: bool = False, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.theta_alpha = nn.Parameter(torch.log(alibi_slopes(n_heads)).float())
        self.beta = nn.Parameter(torch.ones(n_heads))
        self.theta_mu = nn.Parameter(torch.zeros(n_heads), requires_grad=learn_mu)

    @property
    def alpha(self) -> torch.Tensor:
        """alpha_h, [H] (tokens): the prior's scale."""
        return torch.exp(-self.theta_alpha)

    @property
    def mu(self) -> torch.Tensor:
        """mu_h, [H] (tokens): the prior's location."""
        return 2 * torch.sinh(self.theta_mu)

    def bias(self, d: torch.Tensor) -> torch.Tensor:
        """The prior at distances d (any shape, tokens): [H, *d.shape] float32. The one formula: the
        reference (:meth:`forward`) evaluates it on the Tq x Tk distances, the fast paths on d = 0..T-1
        (their Toeplitz table, :class:`lctx.kernels.flash_prior.PriorSpec`)."""
        h = lambda t: t.float().reshape(-1, *([1] * d.dim()))  # noqa: E731
        z = (d.float() - h(self.mu)) * h(torch.exp(self.theta_alpha))
        return -((z.abs() + self.eps) ** h(self.beta))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        d = (q_pos[:, :, None] - k_pos[:, None, :]).float()  # [B, Tq, Tk]
        return self.bias(d).transpose(0, 1)


@register_variant("ggd_bam")
class GGDBAM(AttentionVariant):
    """GGD-BAM: softmax attention with the learnable generalized-Gaussian prior :class:`GGDPrior`
    (seed 000, eq. for b_ij). ``variant_options``: ``ggd_shared`` (default True: one prior for all
    layers, the reference's ``global_positional_encoding``), ``ggd_learn_mu`` (default False),
    ``ggd_eps`` (default 1e-5)."""

    summary = "learnable generalized-Gaussian prior -|(i-j-mu)/alpha|^beta per head (BAM)"

    @staticmethod
    def _make_prior(config) -> GGDPrior:
        opts = config.variant_options or {}
        return GGDPrior(config.num_attention_heads, learn_mu=bool(opts.get("ggd_learn_mu", False)),
                        eps=float(opts.get("ggd_eps", 1e-5)))

    @classmethod
    def shared_module(cls, config) -> nn.Module | None:
        return cls._make_prior(config) if (config.variant_options or {}).get("ggd_shared", True) else None

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.prior = None if (config.variant_options or {}).get("ggd_shared", True) else self._make_prior(config)

    def score_bias(self, q_pos, k_pos, ctx: AttnContext):
        prior = self.prior if self.prior is not None else ctx.shared
        return prior(q_pos, k_pos)

    def prior_spec(self, ctx=None):
        from lctx.kernels.flash_prior import PriorSpec

        prior = self.prior if self.prior is not None else getattr(ctx, "shared", None)
        if prior is None:
            return None
        return PriorSpec("ggd", bias=prior.bias)


@register_modifier("ssmax")
class SSMax(AttentionVariant):
    """Scalable-Softmax modifier: content logits times s_h log(n_i) (Nakanishi 2025, eq. 1 with
    n = keys visible to query i; BAM reference ``seq_scale``). Parameter ``ssmax_scale`` [H], init 1."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.ssmax_scale = nn.Parameter(torch.ones(config.num_attention_heads))
        self.scale_bias = bool((config.variant_options or {}).get("ssmax_scale_bias", False))

    def visible_keys(self, q_pos: torch.Tensor) -> torch.Tensor:
        """n_i, [B, Tq] float32: keys query i sees under the causal mask, counted from its document start."""
        return (q_pos + 1).float()

    def prior_spec(self, ctx=None):
        spec = super().prior_spec(ctx)
        if spec is None or spec.ssmax is not None:
            return None
        spec.ssmax, spec.scale_bias = self.ssmax_scale, self.scale_bias
        return spec

    def logit_scale(self, q_pos, ctx):
        c = self.ssmax_scale.float()[None, :, None, None] * torch.log(self.visible_keys(q_pos))[:, None, :, None]
        base = super().logit_scale(q_pos, ctx)
        return c if base is None else base * c
