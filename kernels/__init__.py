"""Fast paths (Triton / FlexAttention) of the attention variants; the references live in lctx.models."""
