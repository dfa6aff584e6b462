"""lctx.chat: --chat-template on|off and --system-prompt (issue 11, item 2): one helper (HFAdapter.prompt) for
every task, the template's tokens counted in the length, the setting in the records and the resume key,
lm-eval's own apply_chat_template for mmlu/arc, a one-line error for a tokenizer without a template."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from gguf_tiny import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402
from helpers import assert_one_line_error, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    """A tiny Llama with a ChatML template (from a GGUF file, converted once)."""
    from lctx.models.adapters.gguf import convert_gguf

    d = tmp_path_factory.mktemp("chat")
    g = write_tiny_gguf(d / "tiny-chat.gguf")
    return convert_gguf(g, d / "tiny-chat")


def _lm(path, **kw):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(path), device="cpu", **kw)


def test_prompt_helper_wraps_user_turn_and_starts_assistant_turn(chat_ckpt):
    off, on = _lm(chat_ckpt), _lm(chat_ckpt, chat_template=True)
    assert off.prompt("Hello there.", " Answer:").text == "Hello there. Answer:"
    p = on.prompt("Hello there.", " Answer:", marks=[6])
    # ChatML as the tokenizer's own template writes it, then RULER's way: the answer prefix opens the
    # assistant's turn, its leading space kept
    assert p.text == "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n Answer:"
    assert p.ids == on.encode(p.text) and p.ids[0] == on.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert p.marks == [len(on.encode("<|im_start|>user\nHello "))]  # tokens before "there."
    sp = _lm(chat_ckpt, chat_template=True, system_prompt="Be brief.")
    assert sp.prompt("Hi", "").text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")


def test_passkey_and_niah_count_the_template_in_the_length(chat_ckpt, tmp_path):
    from lctx.tasks.base import Cell
    from lctx.tasks.niah import NIAH_TASKS
    from lctx.tasks.passkey import Passkey

    on = _lm(chat_ckpt, chat_template=True)
    s = Passkey().build(on, Cell(300, 0.5, 0), 0)
    text = on.decode(s.input_ids)
    assert text.startswith("user\nThere is an important info") and text.endswith("assistant\n The pass key is")
    assert 300 - 12 <= s.n_tokens <= 300  # within one filler sentence of the length, template included
    assert on.decode(s.input_ids[round(s.depth * s.n_tokens):]).startswith(" The pass key is")  # needle depth
    data = tmp_path / "data" / "ruler" / "wonderwords"
    data.mkdir(parents=True)
    (data / "adjectivelist.txt").write_text("red\nbig\n")
    (data / "nounlist.txt").write_text("cat\ndog\n")
    task = NIAH_TASKS["niah_single_1"](data_dir=tmp_path / "data", cache_dir=tmp_path / "c")
    n = task.build(on, Cell(500, 0.5, 0), 0)
    t = on.decode(n.input_ids)
    assert t.startswith("user\nA special magic number is hidden") and "?\nassistant\n The special magic number for" in t
    assert n.meta["total_tokens"] <= 500  # prompt + generation budget, template included
    off = task.build(_lm(chat_ckpt), Cell(500, 0.5, 0), 0)  # the cache keeps the two apart
    assert off.input_ids != n.input_ids and len(list((tmp_path / "c").rglob("*.json"))) == 2


def test_cli_records_the_setting_and_resume_key(chat_ckpt, tmp_path, capsys):
    # 320 tokens: the passkey template alone is 223 with this byte-level tokenizer, 261 in the chat template (the
    # pre-flight refuses less)
    args = ["run", "-m", chat_ckpt, "--tasks", "passkey", "--lengths", "320", "--depths", "0.5", "--samples", "1",
            "--allow-beyond-max", "--out", tmp_path / "o", "--no-progress"]
    assert run_cli(args, capsys)[0] == 0
    code, out, err = run_cli(args + ["--chat-template", "on", "--system-prompt", "Be brief."], capsys)
    assert code == 0, err
    assert "1 sample run, 0 resumed" in out  # chat on is another sample, not the chat-off one resumed
    recs = [json.loads(x) for x in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    assert [r["task_options"].get("chat_template") for r in recs] == [None, "on"]
    assert recs[1]["task_options"]["system_prompt"] == "Be brief."
    import pandas as pd

    t = pd.read_csv(tmp_path / "o" / "results.csv")
    assert t["task_options"].str.contains('"chat_template": "on"').sum() == 2  # exact + digit_acc rows


def test_tokenizer_without_template_is_one_line_error(tmp_path, capsys):
    code, _, err = run_cli(["run", "--tasks", "passkey", "--lengths", "256", "--chat-template", "on", "--out",
                            tmp_path / "o"], capsys)  # the bundled model's tokenizer has no chat template
    assert_one_line_error(code, err, "--chat-template", "no chat template")
    code, _, err = run_cli(["run", "--tasks", "passkey", "--system-prompt", "x", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--system-prompt needs --chat-template on")
    code, _, err = run_cli(["run", "--tasks", "passkey", "--chat-template", "yes", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--chat-template 'yes'")


def test_arc_chat_template_through_lm_eval(chat_ckpt, tmp_path, monkeypatch):
    """mmlu/arc with --chat-template on use lm-eval's own apply_chat_template (called by its evaluator)."""
    from lctx.harness.steps import lmeval_run
    from lctx.tasks import lmeval

    root = tmp_path / "data" / "arc"
    root.mkdir(parents=True)
    recs = [{"id": f"q{i}", "question": {"stem": f"Which is {c}?", "choices": [
        {"text": "sand", "label": "A"}, {"text": c, "label": "B"}]}, "answerKey": "B"} for i, c in enumerate("xy")]
    lines = "".join(json.dumps(r) + "\n" for r in recs)
    (root / "ARC-Easy-Test.jsonl").write_text(lines)
    (root / "ARC-Easy-Dev.jsonl").write_text(lines)
    cls = lmeval.lctx_hflm_class()
    calls = []
    real = cls.apply_chat_template
    monkeypatch.setattr(cls, "apply_chat_template", lambda self, h, **k: calls.append(h) or real(self, h, **k))
    specs, source = lmeval.resolve_tasks(["arc_easy"], tmp_path / "data")
    lm = _lm(chat_ckpt, chat_template=True)
    res = lmeval_run.run_lmeval([lm], specs, source, tmp_path / "o", data_dir=tmp_path / "data", progress=False,
                            log=lambda *a: None, chat_template=True, system_prompt="Be brief.")
    assert res["errors"] == 0 and res["ran"] == 2
    assert calls and calls[0][0] == {"role": "system", "content": "Be brief."}
    assert calls[0][-1]["role"] == "user" and "Question: Which is x?" in calls[0][-1]["content"]
    r = json.loads((tmp_path / "o" / "records.jsonl").read_text().splitlines()[0])
    assert r["task_options"]["chat_template"] == "on" and r["task_options"]["system_prompt"] == "Be brief."
    # n_tokens counts the chat-formatted context (template tokens included)
    assert r["n_tokens"] > len(lm.encode("Question: Which is x?\nAnswer:"))


@pytest.mark.slow
def test_smollm2_passkey_chat_on(data_dir, tmp_path, capsys):
    gguf_file = data_dir / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_file.is_file():
        pytest.skip("SmolLM2 GGUF not in the data dir")
    code, out, err = run_cli(["run", "-m", gguf_file, "--tasks", "passkey", "--lengths", "1k", "--depths", "0.5",
                              "--samples", "1", "--chat-template", "on", "--out", tmp_path / "o", "--no-progress"],
                             capsys)
    assert code == 0, err
    rec = json.loads((tmp_path / "o" / "records.jsonl").read_text().splitlines()[0])
    assert rec["status"] == "ok" and rec["n_tokens"] <= 1024 and rec["metrics"]["exact"] == 1.0, rec


# -- bounded rendering (issue 25, item 1) --------------------------------------------------------------------
#: the chat template of SmolLM2-135M-Instruct's GGUF (tokenizer.chat_template), as the data dir's file holds it
SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                    "{% endif %}")
#: Gemma's: BOS as a variable, no system turn (raise_exception), alternating roles, | trim
GEMMA_TEMPLATE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
                  "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
                  "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/"
                  "user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' "
                  "%}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
                  "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
                  "{{'<start_of_turn>model\n'}}{% endif %}")
#: what other templates use: namespace, ~, tojson, loop controls, {% generation %}, %, str.format, replace, join
FEATURES_TEMPLATE = ("{%- set ns = namespace(sys='') %}{%- if messages[0]['role'] == 'system' %}{%- set ns.sys = "
                     "messages[0]['content'] | trim %}{%- set messages = messages[1:] %}{%- endif %}"
                     "[{{ ns.sys ~ '!' }}]"
                     "{% for m in messages %}{{ '<%s>' % m['role'] }}{{ '{:>3}'.format(loop.index) }}"
                     "{{ m['content'] | replace('  ', ' ') }}{% if loop.last %}{% break %}{% endif %}{% endfor %}"
                     "{{ messages | tojson(indent=2) }}{{ [1, 2] | join(',') }}{% generation %}{{ eos_token }}"
                     "{% endgeneration %}{% if add_generation_prompt %}<a>{% endif %}")


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, GEMMA_TEMPLATE, FEATURES_TEMPLATE, CHAT_TEMPLATE],
                         ids=["smollm2", "gemma", "features", "chatml"])
def test_bounded_render_writes_what_transformers_writes(chat_ckpt, template):
    import jinja2
    from transformers import AutoTokenizer

    from lctx.chat import render_chat

    tok = AutoTokenizer.from_pretrained(chat_ckpt)
    tok.chat_template = template
    for msgs in ([{"role": "user", "content": "Hello  there. "}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]):
        for gen in (True, False):  # False: lm-eval's continue_final_message (an answer prefix)
            kw = dict(add_generation_prompt=gen, continue_final_message=not gen)
            try:
                want = tok.apply_chat_template(msgs, tokenize=False, **kw)
            except jinja2.TemplateError as e:
                with pytest.raises(jinja2.TemplateError, match=str(e)[:20]):
                    render_chat(tok, msgs, **kw)
                continue
            assert render_chat(tok, msgs, **kw) == want, (msgs, gen)


@pytest.fixture(scope="module")
def chat_lm(chat_ckpt):
    return _lm(chat_ckpt, chat_template=True)


def _render_with(lm, template):
    """(the LctxError of lm.prompt under ``template``, CPU seconds of this process, peak traced bytes). CPU time,
    not wall time: a busy machine stretches the wall clock, not the work a bomb makes before its limit stops it
    (a wall-clock bound of 5 s measured 10.2 s at load 13)."""
    import time
    import tracemalloc

    from lctx.errors import LctxError

    lm.tokenizer.chat_template = template
    tracemalloc.start()
    t0 = time.process_time()
    try:
        with pytest.raises(LctxError) as e:
            lm.prompt("Hello there.", " Answer:")
        return str(e.value), time.process_time() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        lm.tokenizer.chat_template = CHAT_TEMPLATE


BOMBS = {"F1": ("{{ 'a' * 2000000000 }}", "the size limit", "the * operator would make 2000000000"),
         # the output held in a {% set %} block (no output piece reaches the render's stream): 10^12 characters
         "nested-loops": ("{% set x %}{% for i in range(100000) %}{% for j in range(100000) %}" + "x" * 100
                          + "{% endfor %}{% endfor %}{% endset %}{{ x }}", "the work limit", "an output expression"),
         "join": ("{{ range(100000) | join('a' * 100000) }}", "the size limit", "the join filter would make"),
         # 2^40 references in 40 small lists: its text (the namespace's repr) would be terabytes
         "namespace-doubling": ("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}"
                                "{% endfor %}{{ ns }}", "the size limit", "namespace attribute 'l' is given one")}


@pytest.mark.parametrize("name", list(BOMBS))
def test_template_bombs_fail_within_seconds_and_small(chat_lm, name):
    # F1: a GGUF whose template is {{ 'a' * 2000000000 }} reached 6.26 GB under --chat-template on
    template, *needles = BOMBS[name]
    msg, cpu_s, peak = _render_with(chat_lm, template)  # process CPU time, not wall time (stretches under load)
    assert cpu_s < 5 and peak < 2**30, (cpu_s, peak)
    assert "\n" not in msg and msg.startswith(f"the chat template of {chat_lm.chat_source()} went past ")
    assert all(n in msg for n in needles) and msg.endswith("use --chat-template off"), msg


def test_loop_output_and_time_limits(chat_lm, monkeypatch):
    from lctx import chat

    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    msg, cpu_s, _ = _render_with(chat_lm, loops)  # process CPU time, not wall time
    assert f"the limit of {chat.MAX_STEPS} loop iterations and calls" in msg and cpu_s < 5
    msg, _, _ = _render_with(chat_lm, "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}")
    assert "the output limit" in msg and "8 x the messages' length" in msg
    monkeypatch.setattr(chat, "MAX_SECONDS", 0.0)
    msg, _, _ = _render_with(chat_lm, "{% for i in range(10) %}{{ i }}{% endfor %}")
    assert "the time limit (0 s)" in msg


def test_gguf_template_bomb_is_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "cache"))
    g = write_tiny_gguf(tmp_path / "bomb.gguf", chat_template="{{ 'a' * 2000000000 }}")
    code, _, err = run_cli(["run", "-m", g, "--tasks", "passkey", "--lengths", "320", "--depths", "0.5", "--samples",
                            "1", "--allow-beyond-max", "--chat-template", "on", "--out", tmp_path / "o",
                            "--no-progress"], capsys)
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]  # after the line that the GGUF was dequantised
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"error: the chat template of model 'bomb' ({g}) went past the size limit"), err


def test_template_error_advice_names_only_given_options(chat_lm):
    # issue 25 (minor): "drop --system-prompt" was advised when no --system-prompt was given
    refuses = "{{ raise_exception('Conversation roles must alternate') }}"
    msg, _, _ = _render_with(chat_lm, refuses)
    assert "roles must alternate" in msg and "--system-prompt" not in msg and msg.endswith("use --chat-template off")
    chat_lm.system_prompt = "Be brief."
    try:
        msg, _, _ = _render_with(chat_lm, refuses)
    finally:
        chat_lm.system_prompt = None
    assert "drop --system-prompt or use --chat-template off" in msg
