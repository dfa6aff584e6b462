"""lctx.models.variants: ALiBi slopes and bias, RoPE's relative scores."""

from __future__ import annotations

import torch

from helpers import tiny_config
from lctx.models import alibi_slopes, get_variant
from lctx.models.variants import reference_attention


def test_alibi_slopes_8_heads():
    """ALiBi's slopes for 8 heads are Press et al.'s 1/2 ... 1/256."""
    # Press et al. 2022: for 8 heads the slopes are 1/2, 1/4, ..., 1/256.
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)], dtype=torch.float64))


def test_alibi_slopes_12_heads_reference_interleave():
    """Issue 2: 12 heads interleave the 16-head slopes as the reference get_slopes does."""
    # ofirpress/attention_with_linear_biases get_slopes(12): the 8-head slopes, then every other
    # 16-head slope: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 = 0.7071, 0.3536, 0.1768, 0.0884 (issue 2).
    s = alibi_slopes(12)
    assert torch.allclose(s[:8], alibi_slopes(8))
    assert torch.allclose(s[8:], torch.tensor([0.7071, 0.3536, 0.1768, 0.0884], dtype=torch.float64), atol=1e-4)


def test_alibi_bias_sign_row_weights():
    """ALiBi's bias lowers far keys: a hand-computed softmax row."""
    # Hand computation: row 3 of a 4-token causal softmax, uniform scores, slope 0.5:
    # softmax(-1.5, -1, -0.5, 0) = 0.1015, 0.1674, 0.2760, 0.4551.
    cfg = tiny_config("alibi", hidden_size=64, num_attention_heads=8)  # head 0 slope = 0.5
    alibi = get_variant("alibi")(cfg, 0)
    pos = torch.arange(4)[None]
    bias = alibi.score_bias(pos, pos, None)
    q = torch.zeros(1, 8, 4, 4)
    v = torch.eye(4).expand(1, 8, 4, 4)  # one-hot values: the output row is the attention row
    allowed = torch.tril(torch.ones(4, 4, dtype=torch.bool))[None, None]
    w = reference_attention(q, q.clone(), v, allowed, bias)[0, 0, 3]
    assert torch.allclose(w, torch.tensor([0.1015, 0.1674, 0.2760, 0.4551]), atol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    """RoPE's scores depend only on the relative position."""
    cfg = tiny_config("rope")
    rope = get_variant("rope")(cfg, 0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return (rope.rotate(q, torch.tensor([[i]])) * rope.rotate(k, torch.tensor([[j]]))).sum()

    assert torch.allclose(score(7, 3), score(1004, 1000), atol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 5), atol=1e-3)
