"""lctx.outside (issue 42 items 1, 4 and 5): the one place that redacts secrets, escapes control characters and caps
quotes of outside text; and, end to end, that nothing a run, its report or ``lctx compare`` prints or writes holds
a planted API key echoed by a gateway, or a raw terminal control from a served model id."""

from __future__ import annotations

import json
import re

import pytest

from lctx import outside as O

#: a planted key that no pattern recognises (not ``sk-`` shaped, no ``Bearer``): only its registration redacts it
KEY = "lctx-planted-7f3e9a2b4c1d5e6f"
#: an OpenAI-style key, recognised without being registered
SK = "sk-proj-Planted0123456789abcdefXYZ"
#: what a hostile served model id can hold: OSC 0 (set the window title) ended by BEL, CSI (recolour), a C1 CSI,
#: a bidi override ("Trojan Source")
CONTROLS = "\x1b]0;PWNED\x07\x1b[31m\x9b2J\u202e"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(autouse=True)
def no_secrets():
    O.forget_secrets()
    yield
    O.forget_secrets()


# ---------------------------------------------------------------------------------------------- the functions

def test_redact_registered_value_and_patterns():
    """A registered key is redacted wherever it stands; ``sk-`` keys and Bearer tokens are redacted unregistered;
    ordinary text and values that are no str are kept. Control: before registration the planted key stays."""
    text = f"Incorrect API key provided: {KEY}. Authorization: Bearer abc.DEF-123 and {SK}"
    assert KEY in O.redact(text)  # control: not shaped like any known key
    O.register_secret(KEY)
    got = O.redact(text)
    assert KEY not in got and SK not in got and "abc.DEF-123" not in got
    assert got == (f"Incorrect API key provided: {O.REDACTED}. Authorization: Bearer {O.REDACTED} and "
                   f"{O.REDACTED}")
    assert O.redact("sk-short and a task") == "sk-short and a task"  # too short for a key: kept
    assert O.redact(3) == 3 and O.redact(None) is None


def test_short_and_non_str_secrets_are_ignored():
    """A value shorter than MIN_SECRET (after stripping) would redact ordinary words: ignored, as is a non-str."""
    O.register_secret(" ab ")
    O.register_secret(None)
    O.register_secret(12345)
    assert O.redact("ab 12345 tab") == "ab 12345 tab"
    O.register_secret(f"  {KEY}\n")  # stripped, as an environment variable's value often needs
    assert O.redact(f"x{KEY}y") == f"x{O.REDACTED}y"


def test_longer_secret_wins_over_one_it_contains():
    """Two registered keys, one inside the other: the longer is removed whole (no tail of it left)."""
    O.register_secret("abcd1234")
    O.register_secret("abcd1234-tail-5678")
    assert O.redact("k=abcd1234-tail-5678;") == f"k={O.REDACTED};"
    assert O.redact("k=abcd1234;") == f"k={O.REDACTED};"


def test_redaction_is_idempotent():
    """Redacting twice changes nothing more (a sink may meet text another sink redacted)."""
    O.register_secret(KEY)
    once = O.redact(f"Bearer {KEY} {SK}")
    assert O.redact(once) == once and O.safe(O.safe(once)) == O.safe(once)


def test_printable_escapes_every_control_kind():
    """C0 (ESC, BEL, CR), DEL, C1 (CSI 0x9b) and bidi overrides become visible escapes; tab and newline stay unless
    one_line; ordinary non-ASCII text is kept."""
    s = f"a{CONTROLS}\x7f\r\tb\nc é ✓ 日本"
    got = O.printable(s)
    assert RAW.search(got.replace("\t", "").replace("\n", "")) is None
    assert "\\x1b]0;PWNED\\x07\\x1b[31m\\x9b2J\\u202e\\x7f\\x0d" in got
    assert "\tb\nc é ✓ 日本" in got
    one = O.printable(s, one_line=True)
    assert "\n" not in one and "\t" not in one and "\\x09b\\x0ac" in one
    assert O.has_control(s) and not O.has_control("plain é") and O.has_control("tab\t")


def test_quote_caps_and_counts_what_it_left_out():
    """quote: redacted, one line, escaped, at most ``limit`` characters and says how many were left out; a short
    text is whole (control)."""
    O.register_secret(KEY)
    long = f"{KEY} " + "x" * 1000 + "\n\x1b"
    q = O.quote(long, limit=50)
    assert KEY not in q and "\n" not in q and "\x1b" not in q
    left = len(O.printable(" ".join(O.redact(long).split()), one_line=True)) - 50
    assert q.endswith(f"... ({left} more characters left out)") and len(q) == 50 + len(f"... ({left} more "
                                                                                     "characters left out)")
    assert O.quote("short  text\n") == "short text"


def test_cap_keeps_lines_bounds_the_message():
    """cap (a whole message at a sink): newlines kept, controls escaped, key redacted, cut at ``limit`` with the
    count; a message under the limit is only escaped and redacted."""
    O.register_secret(KEY)
    msg = f"line one {KEY}\nline two \x1b[2J" + "y" * 5000
    got = O.cap(msg, limit=100)
    assert got.startswith(f"line one {O.REDACTED}\nline two \\x1b[2J")
    assert got.endswith(f"... ({len(O.safe(msg)) - 100} more characters left out)")
    assert O.cap("fine\nas is") == "fine\nas is"


def test_quote_list_bounds_a_list_of_names():
    """A server listing 100,000 model ids: the first few, each capped, then the count of the rest."""
    ids = [f"model-{i}-" + "z" * 200 for i in range(100_000)]
    got = O.quote_list(ids, limit=3, each=20)
    assert got.endswith(", and 99997 more") and len(got) < 300


def test_clean_walks_json_like_values():
    """clean: every str of a record (keys too) redacted; with escape also printable; numbers, None and the
    structure kept."""
    O.register_secret(KEY)
    rec = {"error": f"HTTP 401 ({KEY})", "metrics": {"exact": 1.0}, "opts": [KEY, 3, None, (KEY,)],
           KEY: "v", "model": f"m{CONTROLS}"}
    got = O.clean(rec)
    assert KEY not in json.dumps(got) and got["metrics"] == {"exact": 1.0} and got["opts"][1:3] == [3, None]
    assert got["model"] == rec["model"]  # a JSON sink escapes C0 itself: the raw text is kept
    assert O.clean(rec, escape=True)["model"] == O.printable(rec["model"])


# ---------------------------------------------------------------------------------------------- end to end

RUN = ["--tasks", "passkey", "--lengths", "300", "--depths", "0.5", "--samples", "2", "--no-progress", "--retries", "0"]


def _cli(args, capsys) -> tuple[int, str, str]:
    """``lctx ARGS`` in-process: (exit status, stdout, stderr); an exception main() lets through is printed as the
    console script's hook prints it (:func:`lctx.cli.uncaught_text`), exit status 1."""
    from lctx.cli import main, uncaught_text

    try:
        code = main([str(a) for a in args])
    except Exception as e:  # noqa: BLE001 - what a user of the console script would see
        code = 1
        print(uncaught_text(e), file=__import__("sys").stderr)
    got = capsys.readouterr()
    return code, got.out, got.err


def _files_holding(root, needles: list[bytes]) -> list[str]:
    """The files under ``root`` (a run, its report, compare's output) whose bytes hold any of ``needles``."""
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file()
            and any(n in p.read_bytes() for n in needles)]


def _run_report_compare(url, tmp_path, capsys, baseline=None, key_env="LCTX_T_KEY") -> tuple[list, str]:
    """lctx run against ``url``, then (when it wrote a summary) lctx report of it and lctx compare of it against
    ``baseline`` (itself when None): (exit statuses, everything printed on stdout and stderr)."""
    out = tmp_path / "run"
    codes, printed = [], ""
    code, o, e = _cli(["run", "--model", url, *RUN, "--out", out, "--api-key-env", key_env], capsys)
    codes.append(code)
    printed += o + e
    if (out / "summary.csv").is_file():
        for args in (["report", out, "--out", tmp_path / "report"],
                     ["compare", out, "--baseline", baseline or out, "--out", tmp_path / "compare"]):
            code, o, e = _cli(args, capsys)
            codes.append(code)
            printed += o + e
    return codes, printed


@pytest.fixture(scope="module")
def clean_baseline(tmp_path_factory):
    """A run of the key-checking stub that went well: the baseline ``lctx compare`` judges the faulty runs on."""
    import os

    from stub_server import StubServer

    from lctx.cli import main

    out = tmp_path_factory.mktemp("baseline") / "run"
    os.environ["LCTX_T_KEY"] = KEY
    try:
        with StubServer(api_key=KEY) as s:
            assert main(["run", "--model", s.url, *RUN, "--out", str(out), "--api-key-env", "LCTX_T_KEY"]) == 0
    finally:
        os.environ.pop("LCTX_T_KEY", None)
    return out


#: (endpoint, fault, how many requests to that endpoint pass first): each status at each endpoint's first
#: request, then a tokenizer that fails part-way and one completion that fails after the trust probe passed (the
#: completions before it: the token-id prompt probe, the trust probe's greedy completion and its echo)
KEY_FAULTS = [(path, fault, 0) for path in ("/v1/models", "/extras/tokenize", "/v1/completions")
              for fault in ("401-key", "403-key", "500-key")] + [("/extras/tokenize", "500-key", 3),
                                                                 ("/v1/completions", "500-key", 3)]


@pytest.mark.slow  # 11 cases of a run, a report and a compare (~1 CPU s each) and a baseline run
@pytest.mark.parametrize("path,fault,after", KEY_FAULTS, ids=[f"{p}-{f}-after{a}" for p, f, a in KEY_FAULTS])
def test_a_key_echoing_gateway_leaks_the_key_nowhere(path, fault, after, clean_baseline, tmp_path, capsys,
                                                     monkeypatch):
    """Issue 42 item 1: a gateway answers 401/403/500 quoting the API key it was given ("Incorrect API key
    provided: ...") on /v1/models, the tokenizer or a completion. Whatever the run makes of it (refused at load,
    the trust probe's reason, a sample's error), nothing it prints or writes, nor its report nor lctx compare's
    output, holds the key: grep over stdout, stderr and every file. The stub did echo it (control), and no
    traceback is printed."""
    from stub_server import StubServer

    monkeypatch.setenv("LCTX_T_KEY", KEY)
    with StubServer(api_key=KEY) as s:
        s.fail(fault, times=None if after == 0 else 1, path=path, after=after)
        codes, printed = _run_report_compare(s.url, tmp_path, capsys, clean_baseline)
        assert s.count(path, int(fault[:3])) >= 1, "the stub never echoed the key: the test tests nothing"
    assert KEY not in printed, printed
    assert _files_holding(tmp_path, [KEY.encode()]) == []
    # a refusal (2), all (3) or some (4) samples failed, or none: never a crash (1, a traceback)
    assert "Traceback" not in printed and codes[0] in (0, 2, 3, 4), (codes, printed[-2000:])


@pytest.mark.slow  # a run, a report and a compare: ~1.3 CPU s, ~5 s alone (the run's imports)
def test_a_key_in_the_served_model_id_and_terminal_controls_reach_no_sink(tmp_path, capsys, monkeypatch):
    """Issue 42 items 1 and 5: a served model id holding the planted key and OSC/CSI/BEL/C1/bidi bytes. The key
    reaches no output by this route either; stdout, stderr, report.md, the CSVs and compare.md hold no raw control
    character (escaped as ``\\x1b``: the id stays recognisable), report.html none either. Control: the id is what
    the stub served."""
    from stub_server import StubServer

    monkeypatch.setenv("LCTX_T_KEY", KEY)
    model_id = f"toy{CONTROLS}-{KEY}"
    with StubServer(api_key=KEY, model_id=model_id) as s:
        s.fail("500-key", times=1, path="/v1/completions", after=3)  # a failed sample too: failures.csv
        codes, printed = _run_report_compare(s.url, tmp_path, capsys)
    assert len(codes) == 3 and codes[1:] == [0, 0] and "Traceback" not in printed, (codes, printed)
    assert KEY not in printed and _files_holding(tmp_path, [KEY.encode()]) == []
    assert RAW.search(printed.replace("\n", "").replace("\t", "")) is None, repr(printed)
    assert "toy\\x1b]0;PWNED\\x07" in printed  # escaped, not dropped
    text_files = [p for p in tmp_path.rglob("*") if p.suffix in (".md", ".csv", ".html")]
    assert {p.name for p in text_files} >= {"report.md", "report.html", "summary.csv", "results.csv",
                                            "failures.csv", "compare.md", "compare.csv"}
    for p in text_files:
        assert RAW.search(p.read_text().replace("\n", "").replace("\t", "")) is None, p


# ---------------------------------------------------------------------------------------------- the CLI's sinks

def test_error_lines_are_redacted_escaped_and_capped(capsys, monkeypatch):
    """An ``error:`` line (an LctxError that quoted a server or a file without lctx.outside.quote) is one line
    through the sink: the key redacted, controls escaped, a megabyte cut with the count left out. A typer usage error
    that echoes an option value with controls too."""
    import lctx.cli as cli
    from lctx.errors import LctxError

    O.register_secret(KEY)

    def boom(*a, **k):
        raise LctxError(f"the server said {KEY}{CONTROLS} " + "z" * 1_000_000)

    monkeypatch.setattr(cli, "evaluate", boom)
    code, out, err = _cli(["run", "--model", "m", "--out", "x"], capsys)
    assert code == 2 and err.startswith("error: the server said [redacted]\\x1b]0;PWNED")
    assert KEY not in err and RAW.search(err.rstrip("\n")) is None and len(err) < O.LINE_LIMIT + 100
    assert err.rstrip("\n").endswith("more characters left out)")
    code, out, err = _cli(["run", "--samples", f"x{CONTROLS}"], capsys)
    assert code == 2 and err.startswith("error: ") and RAW.search(err.rstrip("\n")) is None, repr(err)


def test_an_uncaught_exception_is_printed_redacted(capsys):
    """A bug's traceback (the console script's excepthook, lctx.cli.uncaught_text): its message may quote a server's
    reply: redacted and escaped, the traceback kept (control: the frame and the exception's type are there)."""
    from lctx.cli import _redacted_excepthook

    O.register_secret(KEY)
    try:
        raise ValueError(f"HTTP 500 (Authorization: Bearer {KEY}){CONTROLS}")
    except ValueError as e:
        _redacted_excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert "Traceback" in err and "test_an_uncaught_exception_is_printed_redacted" in err and "ValueError" in err
    assert KEY not in err and RAW.search(err.replace("\n", "")) is None


def test_every_write_of_the_cli_streams_is_redacted(capsys):
    """The CLI's stdout and stderr (lctx.cli._PipeSafe) redact whatever writes to them, a library's print included:
    the second line of defence behind the sinks' own."""
    import sys

    from lctx.cli import _PipeSafe

    O.register_secret(KEY)
    s = _PipeSafe(sys.stdout)
    assert s.write(f"lib says {KEY}\n") == len(f"lib says {KEY}\n")
    s.flush()
    assert capsys.readouterr().out == "lib says [redacted]\n"


@pytest.mark.slow  # two runs of the stub and a compare: ~1 CPU s, ~5 s alone (the run's imports)
def test_the_trust_probe_reason_is_printed_once(tmp_path, capsys):
    """Issue 42 item 4 (issue 45): a served model whose trust probe fails: lctx run printed the 100-character
    reason three times (the load warning, the unavailable line, the note under the table); now once, the others
    referring to it. lctx compare of two such runs shows it once too (both sides' reason is the same)."""
    from stub_server import StubServer

    with StubServer(echo_fault="shift") as s:
        printed = []
        for name in ("a", "b"):
            code, out, err = _cli(["run", "--model", s.url, *RUN, "--out", tmp_path / name], capsys)
            assert code == 0, err
            printed.append(out + err)
    reason = json.loads((tmp_path / "a" / "run.json").read_text())
    reason = next(iter(reason["inputs"]["models"].values()))["server"]["trust_probe"]["reason"]
    assert len(reason) > 80  # a long reason (the test's premise)
    head = " ".join(reason.split())[:60]
    assert printed[0].count(head) == 1, printed[0]
    assert "the reason is in the warning above" in printed[0]
    code, out, err = _cli(["compare", tmp_path / "a", "--baseline", tmp_path / "b"], capsys)
    assert code == 0 and (out + err).count(head) == 1, out + err
