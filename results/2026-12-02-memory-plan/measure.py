"""Run one `lctx run` in this process and measure the memory its prefills really take, beside the plan it made.

    python measure.py OUT.json -- run --model ... --tasks passkey --lengths 4k ...

At the first prefill (HFAdapter.prefill), before it runs: the weights are paged in (a sum over every parameter,
so that memory-mapped safetensors count as resident), a 256-token warm-up prefill runs (code pages, lazy
buffers: lctx bench --model's --warmup-tokens), freed heap pages go back (malloc_trim), and the peak resident set
(VmHWM) is reset through /proc/self/clear_refs. After every prefill, greedy decode and teacher-forced call the
peak is read again. Written to OUT.json:

- base_bytes: VmRSS when the reset happened (runtime + weights + tokenizer + data);
- working_bytes: the largest VmHWM read after an adapter call, minus base_bytes: what the sample's prefill,
  decode and scoring added at their peak (what the plan's items other than the weights estimate);
- load_hwm_bytes: the process's VmHWM before the reset (model loading, GGUF conversion);
- plans: every plan the run made (HFAdapter.memory_plan: lctx run's memory check), total and items in bytes.

Linux only (/proc). A measuring harness, not part of lctx: it wraps HFAdapter's methods from outside.
"""

from __future__ import annotations

import json
import sys

import torch

from lctx.harness.commands.bench import _malloc_trim, _proc_status, _reset_hwm
from lctx.models.adapters import hf

STATE = {"base_bytes": None, "load_hwm_bytes": None, "hwm_bytes": 0, "reset": False, "plans": [], "calls": 0}


def _first_call(lm) -> None:
    STATE["load_hwm_bytes"] = _proc_status("VmHWM:")
    with torch.inference_mode():
        for p in lm.model.parameters():
            p.sum()  # touches every page
        warm = lm.with_bos([5 + i % 200 for i in range(255)])
        _ORIG["prefill"](lm, warm)
    _malloc_trim()
    STATE["base_bytes"] = _proc_status("VmRSS:")
    STATE["reset"] = _reset_hwm()


def _wrap(name):
    orig = getattr(hf.HFAdapter, name)
    _ORIG[name] = orig

    def call(self, *a, **kw):
        if STATE["base_bytes"] is None:
            _first_call(self)
        out = orig(self, *a, **kw)
        STATE["calls"] += 1
        STATE["hwm_bytes"] = max(STATE["hwm_bytes"], _proc_status("VmHWM:") or 0)
        return out

    setattr(hf.HFAdapter, name, call)


_ORIG: dict = {}


def _wrap_plan():
    orig = hf.HFAdapter.memory_plan

    def memory_plan(self, *a, **kw):
        plan = orig(self, *a, **kw)
        STATE["plans"].append({"length": plan.length, "total": plan.total, "impl": plan.impl,
                               "attn_path": plan.attn_path, "chunk": plan.chunk_size, "dtype": plan.dtype,
                               "items": {i.name: i.bytes for i in plan.items}})
        return plan

    hf.HFAdapter.memory_plan = memory_plan


def main() -> int:
    out, sep, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    assert sep == "--", "usage: measure.py OUT.json -- LCTX ARGS"
    for name in ("prefill", "greedy", "greedy_batch", "continuation_logits", "score_continuation"):
        _wrap(name)
    _wrap_plan()
    from lctx.cli import main as lctx_main

    code = 1
    try:
        code = lctx_main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        base = STATE["base_bytes"]
        STATE["working_bytes"] = (STATE["hwm_bytes"] - base) if base is not None else None
        STATE["exit_code"] = code
        with open(out, "w") as f:
            json.dump(STATE, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
