"""Seed 000 (Bianchessi et al., "Bayesian Attention Mechanism", arXiv 2505.22842; reference code
github.com/ArthurSBianchessi/BAM, ``models/bam_ssmax.py`` and ``train.py``): the GGD-BAM positional prior
and Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399).

``ggd_bam``: an additive logit bias b_ij for query i and key j <= i, per head h. Three parameterisations
of the same family (``variant_options["ggd_form"]``), all from the same three unconstrained parameters
per head: ``theta_alpha`` = log(1/alpha_h) (initialised to log of the ALiBi slope, as the reference's
``scale_init='slope'``), ``beta`` (any real: beta in (0, 1) is a heavy tail, beta <= 0 the inverted
prior) and ``theta_mu`` (mu = 2 sinh(theta_mu), frozen at 0 unless ``ggd_learn_mu``):

- ``"reference"`` (the default): b_ij = -e^theta_alpha * (|j - i - mu| + eps)^beta, the reference code's
  ``AttentionPrior.forward`` (``models/bam_ssmax.py`` lines 105-106): the scale sits outside the power, so
  dB/dbeta = b * log(|j - i - mu| + eps) has the sign of -log(distance) (beta grows to widen the prior
  only when the loss wants it), and the j = i term is -e^theta_alpha * eps^beta.
- ``"paper"``: b_ij = -(|(j - i - mu) / alpha| + eps)^beta, the paper's equation for B (seed 000) with eps
  added inside the power so the j = i term is finite for beta < 0 (-(eps)^beta).
- ``"legacy"``: b_ij = -(|(i - j - mu) / alpha| + eps)^beta, what lctx computed before config version 2
  (the paper's form with mu's sign flipped). Checkpoints whose ``config.json`` predates
  ``options_version`` load with this form (see :meth:`GGDBAM.option_defaults`), so they compute what they
  computed when they were trained.

With mu = 0 (the default) the three agree at beta = 1 up to a constant per row (ALiBi with slope
1/alpha) and at beta = 0 (NoPE). ``ggd_shared`` (default False: one prior per layer, the paper's 2 L H
parameters, "384 for a 120M model" = 2 x 12 layers x 16 heads; True: one prior for all layers, the
reference's ``global_positional_encoding``).

``+ssmax``: query i's logits are multiplied by c_i = s_h log(n_i), n_i = i + 1 keys visible from the
start of its document (decode steps: the cache length); s_h learnable per head, initialised to 1. Where
the factor goes (``variant_options["ssmax_scale_bias"]``):

- on ``ggd_bam`` the whole logit, c_i (q.k / sqrt(D) + b_ij), as BAM-SSMax with ``ssmax_prior=True``
  (``models/bam_ssmax.py`` lines 33 and 183-184): the prior sharpens with length (default True);
- on every other base (``alibi``, ``rope``, ``nope``, ...) the content logits only, c_i q.k / sqrt(D) + b_ij,
  as the reference's ``alibi_ssmax.py`` (lines 92-94: scale, then add the ALiBi mask) (default False).

Legacy configs (no ``options_version``) keep ``ggd_shared=True`` and the content-only SSMax they were
trained with.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .options import Opt
from .variants import AttentionVariant, AttnContext, alibi_slopes, register_modifier, register_variant

GGD_FORMS = ("reference", "paper", "legacy")
#: ggd_bam's beta initialisations (``ggd_beta_init``): 1 in every head, or 0 to 1 across heads (BAM's shape_init)
GGD_BETA_INITS = ("ones", "linear")


def ggd_bias(dist: torch.Tensor, amp: torch.Tensor, ainv: torch.Tensor, beta: torch.Tensor, mu: torch.Tensor,
             eps: float) -> torch.Tensor:
    """The GGD-BAM prior at distances ``dist``: b(d) = -amp * (|d - mu| * ainv + eps)^beta.

    The one formula every path uses: the reference evaluates it on the Tq x Tk distances
    (:meth:`GGDPrior.forward`), and every fast path (Triton, FlexAttention, the blocked CPU path) reads the
    Toeplitz table b_h[d] = :meth:`GGDPrior.bias` (``torch.arange(T)``), [H, T], through
    :class:`lctx.kernels.flash_prior.PriorSpec`.

    dist: distances d = i - j in tokens (float, any shape broadcastable against the parameters); amp,
    ainv, beta, mu: the kernel parameters of :meth:`GGDPrior.kernel_params` (shapes broadcastable against
    ``dist``, e.g. [H, 1, 1] for [Tq, Tk] distances), in the kernel's convention (mu already carries the
    form's sign). Returns the bias in ``dist``'s broadcast shape, float32 when the inputs are.
    Differentiable in all parameters.
    """
    return -amp * torch.pow((dist - mu).abs() * ainv + eps, beta)


def fall_distance(amp: float, ainv: float, beta: float, mu: float, eps: float, delta: float = 1.0) -> float:
    """The causal distance (tokens) at which the GGD prior :func:`ggd_bias` has fallen ``delta`` nats below its
    largest value over distances d >= 0: meaningful for any shape beta, where alpha is a length only at beta = 1
   . Closed form: b(d) = -amp (|d - mu| ainv + eps)^beta peaks on d >= 0 at d* = max(mu, 0),
    where x0 = |d* - mu| ainv + eps; it is ``delta`` lower where (|d - mu| ainv + eps)^beta = x0^beta +
    delta / amp, i.e. d = mu + ((x0^beta + delta / amp)^(1 / beta) - eps) / ainv. ``inf`` when it never falls that
    far (beta <= 0: the inverted priors of seed 000, whose bias rises with distance; amp = 0: no prior).

    Arguments: one head's :meth:`GGDPrior.kernel_params` (floats), its ``eps``; ``delta`` > 0 in nats.
    Hand check: reference form, alpha = 450, beta = 0.5, mu = 0 (amp = 1/450, ainv = 1): d = ((eps^0.5 + 450)^2
    - eps) = 450^2 = 202,500 tokens to within eps (the bias is -sqrt(d)/450).

    Raises:
        ValueError: ``delta`` <= 0.
    """
    if not delta > 0:
        raise ValueError(f"delta must be > 0 nats, got {delta!r}")
    if beta <= 0 or amp <= 0 or ainv <= 0:
        return float("inf")
    x0 = abs(max(mu, 0.0) - mu) * ainv + eps
    x = (x0 ** beta + delta / amp) ** (1.0 / beta)
    return float(mu + (x - eps) / ainv) if math.isfinite(x) else float("inf")


def fall_distance_of(alpha: float, beta: float, mu: float, form: str, eps: float = 1e-5, delta: float = 1.0) -> float:
    """:func:`fall_distance` from one head's (alpha, beta, mu, form) as ``lctx diagnose prior`` writes them to
    ``prior_params.csv`` (the kernel parameters of :meth:`GGDPrior.kernel_params`: reference amp = 1/alpha,
    ainv = 1, mu_k = -mu; paper amp = 1, ainv = 1/alpha, mu_k = -mu; legacy the same with mu_k = mu).

    Raises:
        ValueError: an unknown form, or ``delta`` <= 0.
    """
    if form not in GGD_FORMS:
        raise ValueError(f"ggd form must be one of {', '.join(GGD_FORMS)}, got {form!r}")
    if form == "reference":
        return fall_distance(1.0 / alpha, 1.0, beta, -mu, eps, delta)
    return fall_distance(1.0, 1.0 / alpha, beta, -mu if form == "paper" else mu, eps, delta)


class GGDPrior(nn.Module):
    """GGD positional prior, per head (seed 000; forms in the module docstring).

    Parameters (each [H]): ``theta_alpha`` (1/alpha = e^theta_alpha, the reference's ``scale``),
    ``beta`` (the reference's ``shape``), ``theta_mu`` (mu = 2 sinh(theta_mu), the reference's ``loc``;
    frozen unless ``learn_mu``). ``form``: ``"reference"`` (default), ``"paper"`` or ``"legacy"``. ``beta_init``:
    ``"ones"`` (default: beta 1 in every head, ALiBi's shape with the slopes as scales) or ``"linear"`` (beta from 0 to 1
    across heads, the reference's ``shape_init='linear'``).
    Forward: q_pos [B, Tq], k_pos [B, Tk] (tokens) -> bias [B, H, Tq, Tk] float32. Memory O(Tq * Tk) per
    head (the fast paths read a table over distances instead, :meth:`bias`).

    Raises:
        ValueError: unknown ``form``.
    """

    def __init__(self, n_heads: int, learn_mu: bool = False, eps: float = 1e-5, form: str = "reference",
                 beta_init: str = "ones"):
        super().__init__()
        if form not in GGD_FORMS:
            raise ValueError(f"ggd_form must be one of {', '.join(GGD_FORMS)}, got {form!r}")
        if beta_init not in GGD_BETA_INITS:
            raise ValueError(f"ggd_beta_init must be one of {', '.join(GGD_BETA_INITS)}, got {beta_init!r}")
        self.eps = eps
        self.form = form
        self.theta_alpha = nn.Parameter(torch.log(alibi_slopes(n_heads)).float())
        # beta_h at initialisation: 1 (ALiBi's shape) or the reference's shape_init='linear', linspace(0, 1, H)
        # (ArthurSBianchessi/BAM models/bam_ssmax.py AttentionPrior: head 0 starts flat, NoPE-like)
        self.beta = nn.Parameter(torch.ones(n_heads) if beta_init == "ones"
                                 else torch.linspace(0, 1, n_heads, dtype=torch.float32))
        self.theta_mu = nn.Parameter(torch.zeros(n_heads), requires_grad=learn_mu)

    @property
    def alpha(self) -> torch.Tensor:
        """alpha_h, [H] (tokens): the prior's scale (1 / the reference's e^scale)."""
        return torch.exp(-self.theta_alpha)

    @property
    def mu(self) -> torch.Tensor:
        """mu_h, [H] (tokens): the prior's location, in the convention of the form (j - i - mu for
        ``reference``/``paper``, i - j - mu for ``legacy``)."""
        return 2 * torch.sinh(self.theta_mu)

    def kernel_params(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(amp, ainv, beta, mu_k), each [H] float32 (live: gradients flow), such that
        b(d) = :func:`ggd_bias` (d, amp, ainv, beta, mu_k, eps) for distance d = i - j.

        reference: amp = 1/alpha, ainv = 1, mu_k = -mu (|j - i - mu| = |d + mu|);
        paper: amp = 1, ainv = 1/alpha, mu_k = -mu; legacy: amp = 1, ainv = 1/alpha, mu_k = mu.
        """
        scale = torch.exp(self.theta_alpha.float())
        one = torch.ones_like(scale)
        mu = self.mu.float()
        if self.form == "reference":
            return scale, one, self.beta.float(), -mu
        return one, scale, self.beta.float(), (-mu if self.form == "paper" else mu)

    def bias(self, dist: torch.Tensor) -> torch.Tensor:
        """b_h(d) for distances ``dist`` [...] (tokens) -> [H, ...] float32 (e.g. a table over
        d = 0..T-1 with ``dist = torch.arange(T)``)."""
        amp, ainv, beta, mu = (t.reshape((-1,) + (1,) * dist.dim()) for t in self.kernel_params())
        return ggd_bias(dist.float(), amp, ainv, beta, mu, self.eps)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        d = (q_pos[:, :, None] - k_pos[:, None, :]).float()  # [B, Tq, Tk]
        return self.bias(d).transpose(0, 1)  # [H, B, Tq, Tk] -> [B, H, Tq, Tk]


@register_variant("ggd_bam")
class GGDBAM(AttentionVariant):
    """GGD-BAM: softmax attention with the learnable generalized-Gaussian prior :class:`GGDPrior`
    (seed 000, eq. for b_ij). ``variant_options``: ``ggd_form`` (``"reference"``, default; ``"paper"``;
    ``"legacy"``), ``ggd_shared`` (default False: a prior per layer, 2 L H parameters as the paper;
    True: one for all layers, the reference's ``global_positional_encoding``), ``ggd_learn_mu`` (default
    False), ``ggd_eps`` (default 1e-5).

    Raises:
        ValueError: an unknown ``ggd_form``.
    """

    summary = "learnable generalized-Gaussian prior -e^theta (|j-i-mu|+eps)^beta per head and layer (BAM)"
    # version 1 (configs saved before ``options_version``) computed the legacy form with one prior shared by
    # all layers (and content-only SSMax: SSMax.option_schema)
    option_schema = {
        "ggd_form": Opt(str, "reference", "prior form: reference -e^theta(|j-i-mu|+eps)^beta, paper "
                        "-(|(j-i-mu)/alpha|+eps)^beta, legacy (options_version 1)", GGD_FORMS,
                        legacy={1: "legacy"}),
        "ggd_shared": Opt(bool, False, "one prior for all layers (BAM's global_positional_encoding)",
                          legacy={1: True}),
        "ggd_learn_mu": Opt(bool, False, "learn the prior's centre mu"),
        "ggd_eps": Opt(float, 1e-5, "epsilon inside |z| + eps"),
        "ggd_beta_init": Opt(str, "ones", "beta at initialisation: ones (every head 1, ALiBi's shape) or linear "
                             "(0 to 1 across heads, the reference's shape_init='linear')", GGD_BETA_INITS)}

    @classmethod
    def _make_prior(cls, config) -> GGDPrior:
        o = cls.option_values(config)
        return GGDPrior(config.num_attention_heads, learn_mu=bool(o["ggd_learn_mu"]), eps=float(o["ggd_eps"]),
                        form=str(o["ggd_form"]), beta_init=str(o["ggd_beta_init"]))

    @classmethod
    def shared_module(cls, config) -> nn.Module | None:
        return cls._make_prior(config) if bool(cls.option_values(config)["ggd_shared"]) else None

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.prior = None if bool(self.option_values(config)["ggd_shared"]) else self._make_prior(config)

    def score_bias(self, q_pos, k_pos, ctx: AttnContext):
        prior = self.prior if self.prior is not None else ctx.shared
        return prior(q_pos, k_pos)

    def prior_spec(self, ctx=None):
        from lctx.kernels.flash_prior import PriorSpec  # lazy: loads triton

        prior = self.prior if self.prior is not None else getattr(ctx, "shared", None)
        if prior is None:
            return None
        return PriorSpec("ggd", bias=prior.bias)  # the fast paths tabulate ggd_bias over d = 0..T-1


@register_modifier("ssmax")
class SSMax(AttentionVariant):
    """Scalable-Softmax modifier: logits times c_i = s_h log(n_i) (Nakanishi 2025, eq. 1 with n = keys
    visible to query i; BAM reference ``seq_scale``). Parameter ``ssmax_scale`` [H], init 1.
    ``variant_options["ssmax_scale_bias"]``: whether c_i also multiplies the positional bias (default:
    True on ``ggd_bam``, as BAM-SSMax ``ssmax_prior=True``; False elsewhere, as ``alibi_ssmax``; False on
    every base for legacy configs)."""

    summary = "Scalable-Softmax: content logits x s_h log(n_i), n_i = keys query i sees (Nakanishi 2025)"
    # True on a ggd_bam base from config version 2 on, else False (version 1: content-only on every base)
    option_schema = {
        "ssmax_scale_bias": Opt(bool, False, "scale the prior too (BAM's seq_scale on the bias; default true "
                                "with ggd_bam)", legacy={1: False}, per_base={"ggd_bam": True})}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.ssmax_scale = nn.Parameter(torch.ones(config.num_attention_heads))
        # a config built for the base variant (e.g. lctx run --attn-override ssmax) lacks the key: the
        # default of this composition at the config's version
        self.scale_bias = bool(type(self).option_values(config)["ssmax_scale_bias"])

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
