"""Make the legacy (options version 1) checkpoints of tests/test_legacy_checkpoints.py.

Run once against lctx commit e512621 (before ``options_version`` existed), with ``lctx`` importable from
that tree:  ``PYTHONPATH=<shim to e512621> python tests/data/legacy_v1/make.py``. For each variant it
saves a tiny random checkpoint (parameters moved off their initialisation so every prior parameter
matters) and the logits that code computed for fixed input ids (``expected.safetensors``), with both
the reference attention and SDPA. The config.json files have no ``options_version``: the new code must
load them as version 1 and compute the same logits.
"""

from pathlib import Path

import torch
from safetensors.torch import save_file

from lctx.models import LctxConfig, LctxForCausalLM

HERE = Path(__file__).resolve().parent
CASES = {
    "ggd_bam_ssmax": ("ggd_bam+ssmax", {"ggd_learn_mu": True}),
    "ggd_bam": ("ggd_bam", {}),
    "ggd_bam_layers": ("ggd_bam", {"ggd_shared": False}),
    "acc_rot": ("acc_rot", {}),
    "alibi_ssmax": ("alibi+ssmax", {}),
}

if __name__ == "__main__":
    ids = torch.randint(3, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    tensors = {"input_ids": ids}
    for name, (variant, opts) in CASES.items():
        torch.manual_seed(0)
        cfg = LctxConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                         variant=variant, variant_options=opts, train_length=32)
        model = LctxForCausalLM(cfg).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(("beta", "theta_alpha", "ssmax_scale")):
                    p.add_(0.3 * torch.randn_like(p))
                if n.endswith("theta_mu"):
                    p.copy_(0.8 * torch.randn_like(p))
        model.save_pretrained(HERE / name)
        for impl in ("reference", "sdpa"):
            model.config.attn_impl = impl
            with torch.no_grad():
                tensors[f"{name}.{impl}"] = model(ids).logits[..., :16].contiguous()  # 16 of 300 columns: small file
    save_file(tensors, HERE / "expected.safetensors")
    print("wrote", HERE)
