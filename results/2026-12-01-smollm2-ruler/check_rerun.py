"""Compare the samples two runs have in common (same task, length, depth, sample, seed): the continuation the
model generated, RULER's metrics (string_match_all/part) and the teacher-forced scores (tf_*).

Usage: python check_rerun.py OLD/records.jsonl NEW/records.jsonl
Used here to check that the 1K run made at c6e1d68 (run-1k/) is what the code of this commit makes: the rerun
(run-1k-rerun/, stopped after 7 samples when the machine became ~7x slower) matches it sample for sample.
"""

import json
import sys


def load(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        out[(r["task"], r["length"], r["depth"], r["sample"], r["seed"])] = r
    return out


old, new = load(sys.argv[1]), load(sys.argv[2])
common = [k for k in new if k in old]
same_text = same_match = 0
max_tf = 0.0
for k in common:
    a, b = old[k], new[k]
    same_text += a["extra"].get("continuation") == b["extra"].get("continuation") and a["n_tokens"] == b["n_tokens"]
    same_match += all(a["metrics"].get(m) == b["metrics"].get(m) for m in ("string_match_all", "string_match_part"))
    tf = [abs(a["metrics"][m] - b["metrics"][m]) for m in a["metrics"] if m.startswith("tf_") and m in b["metrics"]]
    max_tf = max([max_tf] + tf)
    print(f"{k[0]:>16} L={k[1]} depth={k[2]} sample={k[3]}: n_tokens {a['n_tokens']}/{b['n_tokens']}, "
          f"continuation {'same' if a['extra'].get('continuation') == b['extra'].get('continuation') else 'DIFFERS'}, "
          f"wall {a['wall_s']:.1f}/{b['wall_s']:.1f} s")
print(f"{len(common)} samples in common (old git_rev {old[common[0]]['git_rev']}, new {new[common[0]]['git_rev']}): "
      f"{same_text} with the same prompt length and continuation, {same_match} with the same string_match_all/part, "
      f"largest |difference| of a tf_* score {max_tf:.2g}")
