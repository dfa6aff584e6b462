"""Loss of a checkpoint on 16 windows of 128 tokens of pg98 (characters 20,000-60,000) with the positional-LSH
bins drawn in different ways: the fixed eval draw, fresh draws, other fixed seeds, and train mode. Used to
check that an alibi_lsh model's held-out loss is not an artefact of its bins (README, last section).

    python results/2026-12-01-seed003-lsh/lsh_modes.py CHECKPOINT [DATA_DIR]
"""
import torch, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
import lctx.models  # registers
torch.manual_seed(0)
ck = sys.argv[1]
data = sys.argv[2] if len(sys.argv) > 2 else "../shared/data"
tok = AutoTokenizer.from_pretrained(ck)
text = open(data + '/books/pg98_a_tale_of_two_cities.txt').read()[20000:60000]
ids = torch.tensor(tok(text)['input_ids'][:128*16]).view(16,128)
def nll(m):
    with torch.no_grad():
        out = m(input_ids=ids, labels=ids)
    return out.loss.item()
m = AutoModelForCausalLM.from_pretrained(ck); m.eval()
print('eval fixed bins', nll(m))
for mod in m.modules():
    if hasattr(mod,'resample_eval'): mod.resample_eval=True
print('eval resampled', [round(nll(m),3) for _ in range(3)])
for mod in m.modules():
    if hasattr(mod,'resample_eval'): mod.resample_eval=False; mod._fixed=None
for sd in (1,2,3):
    for i,mod in enumerate([x for x in m.modules() if hasattr(x,'resample_eval')]): mod.seed = 1000*sd+i; mod._fixed=None
    print('eval fixed seed', sd, round(nll(m),3))
m.train()
with torch.no_grad():
    print('train mode (resampled, dropout?)', round(m(input_ids=ids, labels=ids).loss.item(),3))
