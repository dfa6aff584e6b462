"""Check lctx's RULER generators against RULER's own (NVIDIA/RULER scripts/data/synthetic/*.py), same tokenizer.

Run RULER's generators first, outside the project (see README.md in this folder: a scratch copy of RULER's
scripts/data, `--tokenizer_type hf`, seed 42, 3 samples per task and length, the QA fixtures of
tests/ruler_fixtures.py as its json/squad.json and json/hotpotqa.json), then:

    LCTX_DATA_DIR=../shared/data python check_vs_ruler.py RULER_OUT_DIR HF_MODEL_DIR RULER_JSON_DIR

RULER_OUT_DIR holds out1024/<task>/validation.jsonl and out4096/<task>/validation.jsonl. For every task and
length it prints structural facts of RULER's prompts and of lctx's (same tokenizer, base template, no chat
template) and compares a masked skeleton of the prompts: the template, the example, the list and number
formats, the answer prefix, with every random draw (names, values, words, where the lines go) masked out.
"""

import collections
import json
import os
import re
import sys

from lctx.models.adapters.hf import load_lm
from lctx.tasks import Cell, get_task

RULER_OUT, HF_DIR, RULER_JSON = sys.argv[1:4]
lm = load_lm(HF_DIR, device="cpu")  # lctx's view of the model: BOS only where its tokenizer adds one
tok = lm.tokenizer
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def vt_skel(text):
    s = re.sub(r"\b[A-Z]{5}\b", "<V5>", text)
    s = re.sub(r"\b(?!VAR\b)[A-Z]{3}\b", "<V3>", s)
    s = re.sub(r"\b\d{5}\b", "<N>", s)
    return s.replace(NOISE + "\n", "").replace(NOISE, "")  # where the noise lines go is random in both


def vt_facts(text, answers):
    main = text[text.rindex("Memorize and track"):]
    value = re.search(r"assigned the value (\d{5}) in the text above", main).group(1)
    chain = [re.search(r"VAR ([A-Z]{5}) = " + value, main).group(1)]
    while m := re.search(r"VAR ([A-Z]{5}) = VAR " + chain[-1] + r" \n", main):
        chain.append(m.group(1))
    icl = text[:text.rindex("Memorize and track")]
    return dict(noise_lines=main.count(NOISE), example_noise_lines=icl.count(NOISE),
                chain_from_value_eq_answer=chain == list(answers), example_tokens=len(tok.tokenize(icl)))


def cwe_skel(text):
    s = re.sub(r"\d+\. [^\n]*?(?= \d+\. |\n|$)", "<E>", text)
    return re.sub(r"<E>(?: <E>)*", "<LIST>", s)


def cwe_facts(text, answers):
    main = text[text.rindex("Below is a numbered list"):]
    entries = re.findall(r"(\d+)\. (\S+)", main.split("\nQuestion:")[0])
    c = collections.Counter(w for _, w in entries)
    shots = text[:text.rindex("Below is a numbered list")]
    sc = collections.Counter(w for _, w in re.findall(r"(\d+)\. (\S+)", shots.split("\nQuestion:")[0]))
    return dict(numbered=[int(n) for n, _ in entries] == list(range(1, len(entries) + 1)), entries=len(entries),
                repeats=sorted(set(c.values())), top_words_eq_answer={w for w, k in c.items() if k == max(c.values())} == set(answers),
                example_entries=sum(sc.values()), example_repeats=sorted(set(sc.values())))


def fwe_skel(text):
    return re.sub(r"((?:[a-z]{6}|\.\.\.) ?)+", "<WORDS>", text)


def fwe_facts(text, answers):
    ctx = text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split(" ")
    c = collections.Counter(ctx)
    ranked = [w for w, _ in c.most_common()]
    return dict(words=len(ctx), noise_word_first=ranked[0] == "...", ranks_2_to_4_eq_answer=ranked[1:4] == list(answers),
                top5_counts=[k for _, k in c.most_common(5)])


def qa_skel(text):
    s = re.sub(r"Document \d+:\n[^\n]*(?:\n[^\n]+)*?(?=\n\nDocument|\n\nAnswer the question)", "<DOC>", text)
    return re.sub(r"(<DOC>\n\n)+", "", s)


def qa_facts(text, answers):
    return dict(documents=text.count("\nDocument ") + text.startswith("Document "), answers=answers)


def ruler_rows(L, task):
    rows = [json.loads(x) for x in open(f"{RULER_OUT}/out{L}/{task}/validation.jsonl")]
    return [(r["input"] + r["answer_prefix"], r["outputs"], r["length"]) for r in rows]


def lctx_rows(L, task, n=3):
    kw = {"data_dir": os.environ.get("LCTX_DATA_DIR", "../shared/data")} if task == "cwe" else {}
    if task in ("qa_1", "qa_2"):
        kw = {"path": f"{RULER_JSON}/{'squad' if task == 'qa_1' else 'hotpotqa'}.json"}
    t = get_task(task)(cache=False, **kw)
    out = []
    for s in range(n):
        smp = t.build(lm, Cell(L, 0.5 if "depth" in t.axes else None, s), 0)
        out.append((tok.decode(smp.input_ids), smp.meta["answers"], smp.n_tokens + smp.meta["max_new_tokens"]))
    return out


ok = True
for task, rtask, skel, facts in (("vt", "vt", vt_skel, vt_facts), ("cwe", "cwe", cwe_skel, cwe_facts),
                                 ("fwe", "fwe", fwe_skel, fwe_facts), ("qa_1", "squad", qa_skel, qa_facts),
                                 ("qa_2", "hotpotqa", qa_skel, qa_facts)):
    for L in (1024, 4096):
        r, o = ruler_rows(L, rtask), lctx_rows(L, task)
        for who, rows in (("RULER", r), ("lctx ", o)):
            for text, ans, total in rows[:2]:
                print(f"{task} {L} {who} tokens+budget={total} {facts(text, ans)}")
        same = {skel(t) for t, _, _ in r} == {skel(t) for t, _, _ in o}
        if task.startswith("qa_"):
            same = same and [a for _, a, _ in r] == [a for _, a, _ in o]  # sample i asks question i, as RULER
        ok &= same
        print(f"{task} {L}: masked skeletons identical: {same}")
print("ALL IDENTICAL" if ok else "DIFFERENCES")
