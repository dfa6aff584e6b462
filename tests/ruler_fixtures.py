"""Small QA files in the official formats (SQuAD v2.0 dev, HotpotQA dev distractor), written by the tests.

The text is made up (short encyclopaedic sentences about invented towns); the structure is the official one:

* SQuAD v2.0: ``{"version": "v2.0", "data": [{"title", "paragraphs": [{"context", "qas": [{"question", "id",
  "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}``; unanswerable questions have
  ``is_impossible: true``, empty ``answers`` and ``plausible_answers``;
* HotpotQA (distractor): a list of ``{"_id", "answer", "question", "supporting_facts": [[title, sent_id]],
  "context": [[title, [sentences]]], "type", "level"}`` with ten paragraphs per question, sentences after the
  first starting with a space (as in the released file).
"""

from __future__ import annotations

import json
from pathlib import Path

TOWNS = ["Alder", "Brisk", "Corvel", "Dunmere", "Eskby", "Farrow", "Galton", "Hexley", "Irlam", "Jessup",
         "Kelby", "Lorn", "Marrow", "Netherby", "Oakham", "Pellow", "Quarry", "Rusk", "Selby", "Tarn",
         "Ulvers", "Vesey", "Wendle", "Yarrow"]
RIVERS = ["Amble", "Brent", "Colne", "Dove", "Esk", "Frome", "Glen", "Hull", "Isis", "Kent", "Lune", "Mole"]
TRADES = ["rope", "glass", "cider", "wool", "salt", "paper", "bells", "boats", "cheese", "lace", "tin", "clocks"]


def town_facts(i: int) -> dict:
    """Deterministic facts about town i."""
    return {"town": TOWNS[i % len(TOWNS)] + ("" if i < len(TOWNS) else f" {i // len(TOWNS) + 1}"),
            "river": RIVERS[i % len(RIVERS)], "trade": TRADES[(i * 5) % len(TRADES)], "year": 1100 + 37 * i,
            "people": 800 + 113 * i, "founder": f"{TOWNS[(i + 7) % len(TOWNS)]}son"}


def write_squad(path: str | Path, n_articles: int = 4, paragraphs: int = 4) -> Path:
    """A SQuAD v2.0 dev file: ``n_articles`` articles of ``paragraphs`` paragraphs, two answerable questions per
    paragraph (one with two answer texts) and one unanswerable question per article."""
    data = []
    k = 0
    for a in range(n_articles):
        paras = []
        for p in range(paragraphs):
            f = town_facts(k)
            ctx = (f"{f['town']} is a market town on the river {f['river']}. It was founded in {f['year']} by "
                   f"{f['founder']}, who built the first mill there. The town is known for its {f['trade']}, which "
                   f"is sold at the weekly fair. About {f['people']} people live in {f['town']} today, most of them "
                   f"near the old bridge over the {f['river']}.")
            q1 = {"question": f"Who founded {f['town']}?", "id": f"q{k}a",
                  "answers": [{"text": f["founder"], "answer_start": ctx.index(f["founder"])}], "is_impossible": False}
            q2 = {"question": f"Which river flows through {f['town']}?", "id": f"q{k}b",
                  "answers": [{"text": f["river"], "answer_start": ctx.index(f["river"])},
                              {"text": f"the river {f['river']}", "answer_start": ctx.index(f"the river {f['river']}")}],
                  "is_impossible": False}
            qas = [q1, q2]
            if p == 0:
                qas.append({"question": f"Who is the mayor of {f['town']}?", "id": f"q{k}x", "answers": [],
                            "plausible_answers": [{"text": f["founder"], "answer_start": ctx.index(f["founder"])}],
                            "is_impossible": True})
            paras.append({"qas": qas, "context": ctx})
            k += 1
        data.append({"title": f"Region_{a}", "paragraphs": paras})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path


def write_hotpot(path: str | Path, n_questions: int = 6) -> Path:
    """A HotpotQA dev-distractor file: ``n_questions`` bridge questions, each with its two supporting paragraphs
    (town, then its founder) and eight distractor paragraphs (other towns; some shared between questions)."""
    items = []
    for q in range(n_questions):
        f = town_facts(q)
        gold_town = [f["town"], [f"{f['town']} is a town on the river {f['river']}.",
                                 f" It was founded by {f['founder']} in {f['year']}."]]
        gold_person = [f["founder"], [f"{f['founder']} was a miller and builder.",
                                      f" {f['founder']} was born in the village of Upper {f['river']}."]]
        distract = []
        for d in range(8):
            g = town_facts(q + 3 + d)
            distract.append([g["town"], [f"{g['town']} lies on the {g['river']}.",
                                         f" Its {g['trade']} trade began in {g['year']}."]])
        ctx = [gold_town] + distract[:4] + [gold_person] + distract[4:]
        items.append({"_id": f"h{q:04d}", "answer": f"Upper {f['river']}",
                      "question": f"In which village was the founder of {f['town']} born?",
                      "supporting_facts": [[f["town"], 1], [f["founder"], 1]], "context": ctx,
                      "type": "bridge", "level": "medium"})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items))
    return path
