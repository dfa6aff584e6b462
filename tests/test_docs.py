"""The README and the manual in docs/ stay true to the code (issue 26): every ``lctx ...`` command in their fenced
shell blocks parses against lctx's real CLI (the subcommand exists, every option is one of its options, an option
that takes a value has one), every relative link and ``#anchor`` points at something that exists, the README stays
a front door (at most 15 KB, the two set-up commands first, byte for byte) and its module map names every module of
the tree. No command is run, except the cheap ones in blocks marked ``<!-- runnable -->``. Each check has a control
that feeds it a real mistake."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest
from helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"

#: the README's first two commands: set up and run the bundled default; set up and run the tests (what CI runs)
SETUP_RUN = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . "
             "&& lctx run")
SETUP_TEST = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '.[test]' "
              "&& python -m pytest tests")
README_MAX_BYTES = 15_000  # "at most 15 KB", read strictly
SHELL_LANGS = {"bash", "sh", "shell", "console", "yaml", "yml"}


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# ------------------------------------------------------------------------------------------- reading the pages

def fenced_blocks(text: str) -> list[tuple[str, str, bool]]:
    """``(language, body, runnable)`` of every fenced block; ``runnable``: the line before it is
    ``<!-- runnable -->``."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        runnable = i > 0 and lines[i - 1].strip() == "<!-- runnable -->"
        body, i = [], i + 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((lang, "\n".join(body), runnable))
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code spans (where a ``[x](y)`` is not a link)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if line.startswith(fence):
                fence = None
            continue
        out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def command_lines(lang: str, body: str) -> list[str]:
    """Logical shell lines of a block: backslash continuations joined; in a ``console`` block only the ``$ ``
    lines; in a YAML block (a CI workflow) only the ``run:`` steps, inline or as a ``run: |`` block."""
    raw_lines = body.splitlines()
    if lang in ("yaml", "yml"):
        raw_lines = yaml_run_lines(raw_lines)
    joined, cur = [], ""
    for raw in raw_lines:
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        joined.append(cur + line)
        cur = ""
    if cur:
        joined.append(cur)
    out = []
    for line in joined:
        s = line.strip()
        if lang == "console":
            if not s.startswith("$ "):
                continue
            s = s[2:]
        if s:
            out.append(s)
    return out


def yaml_run_lines(lines: list[str]) -> list[str]:
    """The shell text of a workflow's ``run:`` steps: ``run: CMD``, or the lines of a ``run: |`` block (those
    indented deeper than its key)."""
    out, block_indent = [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if line.strip() and indent <= block_indent:
                block_indent = None
            else:
                out.append(line)
                continue
        m = re.match(r"^(\s*(?:-\s+)?)run:\s*(.*)$", line)
        if m:
            rest = m.group(2).strip()
            if rest in ("|", ">", "|-", ">-"):
                block_indent = len(m.group(1))
            elif rest:
                out.append(rest)
    return out


def lctx_invocations(line: str) -> list[list[str]]:
    """The argument lists of every ``lctx`` invocation on a shell line: ``lctx ARGS``, ``... -m lctx.cli ARGS``
    (torchrun, accelerate) and ``--no-python lctx ARGS``, one per ``&&`` / ``|`` / ``;`` segment; redirections
    and comments dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        tokens = list(lex)
    except ValueError as e:  # an unclosed quote
        raise AssertionError(f"cannot split {line!r}: {e}") from None
    segments, seg, skip = [], [], False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok in ("&&", "||", "|", ";", "&", "(", ")"):
            segments.append(seg)
            seg = []
        elif tok in (">", ">>", "<", ">&", "2>", "&>"):
            skip = True
        else:
            seg.append(tok)
    segments.append(seg)
    found = []
    for seg in segments:
        for i, tok in enumerate(seg):
            if tok == "lctx" or (tok == "lctx.cli" and i > 0 and seg[i - 1] == "-m"):
                found.append(seg[i + 1:])
                break
    return found


def shell_commands(text: str) -> list[tuple[str, list[str]]]:
    """``(line, args)`` of every ``lctx`` invocation in the shell blocks of a page."""
    out = []
    for lang, body, _ in fenced_blocks(text):
        if lang in SHELL_LANGS:
            for line in command_lines(lang, body):
                out += [(line, args) for args in lctx_invocations(line)]
    return out


def inline_commands(text: str) -> list[tuple[str, list[str]]]:
    """``(span, args)`` of every inline code span of the prose that starts with ``lctx `` (``lctx run --stride``)."""
    out = []
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"(?ms)^(`{3,}).*?^\1", "", text))
    for span in spans:
        if span.startswith("lctx ") and "..." not in span:
            out += [(span, args) for args in lctx_invocations(span)]
    return out


# ------------------------------------------------------------------------------------------- checking commands

def _cli():
    import typer

    from lctx.cli import app

    return typer.main.get_command(app)


def _options(cmd) -> dict[str, object]:
    return {o: p for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}


def check_command(args: list[str], root=None, mention: bool = False) -> list[str]:
    """What is wrong with ``lctx ARGS`` against the real CLI, without running it: an unknown (sub)command, an
    option the command does not have, an option that takes a value given none, a flag given one. ``mention``: the
    words name an option in prose (`lctx bench --threads`), so a last option may stand without its value."""
    cmd, path, i = root or _cli(), ["lctx"], 0
    while hasattr(cmd, "commands"):
        if i >= len(args) or args[i] in ("--help", "-h"):
            return []
        if args[i] not in cmd.commands:
            return [f"`{' '.join(path)}` has no command {args[i]!r} (it has {', '.join(sorted(cmd.commands))})"]
        cmd = cmd.commands[args[i]]
        path.append(args[i])
        i += 1
    opts, problems, where = _options(cmd), [], " ".join(path)
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            break
        if tok == "--help" or not tok.startswith("-") or tok == "-" or re.fullmatch(r"-[\d.]+", tok):
            continue
        name, eq, _ = tok.partition("=")
        param = opts.get(name)
        if param is None:
            near = sorted(o for o in opts if o.startswith("--"))
            problems.append(f"`{where}` has no option {name} (options: {' '.join(near)})")
            continue
        if param.is_flag or getattr(param, "count", False):
            if eq:
                problems.append(f"`{where}` {name} is a flag and takes no value ({tok!r})")
            continue
        if not eq:
            if i >= len(args) and not mention:
                problems.append(f"`{where}` {name} needs a value")
            i += max(param.nargs, 1)
    return problems


def _command_failures(pages, mention: bool = False) -> list[str]:
    failures = []
    for page, pairs in pages:
        for line, args in pairs:
            failures += [f"{page}: {line!r}: {p}" for p in check_command(args, mention=mention)]
    return failures


def test_every_shell_command_in_the_docs_parses_against_the_cli():
    pages = [(p.relative_to(REPO), shell_commands(p.read_text())) for p in doc_files()]
    n = sum(len(pairs) for _, pairs in pages)
    assert n >= 40, f"only {n} lctx commands found in the docs' shell blocks: is the extraction broken?"
    failures = _command_failures(pages)
    assert not failures, "\n".join(failures)


def test_every_inline_lctx_command_parses_against_the_cli():
    pages = [(p.relative_to(REPO), inline_commands(p.read_text())) for p in doc_files()]
    assert sum(len(pairs) for _, pairs in pages) >= 20
    failures = _command_failures(pages, mention=True)
    assert not failures, "\n".join(failures)


def test_the_command_check_catches_real_mistakes():
    page = """Some prose with an inline `lctx run --lenghts 1k` span.

```bash
lctx run --model m --tasks passkey \\
    --lengths 1k --depths 0.5 --made-up-flag 3 --out runs/x   # a comment with --not-a-flag
LCTX_NUM_THREADS=1 lctx evaluate --model m
lctx compare runs/x --baseline b && lctx report runs/x --out
torchrun --nproc_per_node 2 -m lctx.cli run --allow-beyond-max=yes ... --out runs/big
lctx diagnose far-mass -m a --lengths 1k --distance 64 --out d/ | tee log.txt
```

```console
$ lctx list tasks --task-fil my.py
output lctx run --not-checked
```
"""
    cmds = shell_commands(page)
    # the continuation is joined and the comment dropped; the yaml/console rules pick only commands
    assert [args[:1] for _, args in cmds] == [["run"], ["evaluate"], ["compare"], ["report"], ["run"],
                                               ["diagnose"], ["list"]]
    problems = [check_command(args) for _, args in cmds]
    assert "--made-up-flag" in problems[0][0] and len(problems[0]) == 1  # and not --not-a-flag, in the comment
    assert "has no command 'evaluate'" in problems[1][0]
    assert problems[2] == []
    assert "--out needs a value" in problems[3][0]
    assert "is a flag and takes no value" in problems[4][0]  # the `...` placeholder itself is fine
    assert problems[5] == []
    assert "--task-fil" in problems[6][0]
    assert "--lenghts" in check_command(inline_commands(page)[0][1], mention=True)[0]
    assert check_command(["bench", "--threads"], mention=True) == []  # prose naming an option
    assert "--threads needs a value" in check_command(["bench", "--threads"])[0]  # a command missing its value


def test_the_yaml_ci_example_is_checked():
    # the GitHub Actions example's `run: |` lines are commands too
    cmds = shell_commands((DOCS / "compare-ci.md").read_text())
    assert any(args[:1] == ["compare"] and "--rules" in args for _, args in cmds)
    bad = "```yaml\n      - run: |\n          lctx compare runs/ci --baseline b --tolerence rel=0.1\n```\n"
    assert "--tolerence" in check_command(shell_commands(bad)[0][1])[0]


# ------------------------------------------------------------------------------------------- links and anchors

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation and symbols dropped, spaces to hyphens."""
    text = heading.strip().lower()
    keep = [c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM"]
    return "".join(keep).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen, out = {}, set()
    for line in _headings(text):
        base = slug(line)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def _headings(text: str) -> list[str]:
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None:
            if line.startswith(fence):
                fence = None
        elif re.match(r"^#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def broken_links(page: Path, text: str) -> list[str]:
    """Relative links of a page whose file, or whose ``#anchor`` in a Markdown file, does not exist."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return bad


def _linked_pages() -> list[Path]:
    # the docs, and the result pages that link into them (so a renamed docs page or section is caught)
    return [*doc_files(), REPO / "results" / "README.md", *sorted((REPO / "results").glob("2026-12-01-*/README.md")),
            REPO / "tests" / "tools" / "README.md"]


def test_every_relative_link_points_at_something_that_exists():
    failures, n = [], 0
    for page in _linked_pages():
        text = page.read_text()
        n += len(re.findall(r"\]\(", prose(text)))
        failures += [f"{page.relative_to(REPO)}: {b}" for b in broken_links(page, text)]
    assert n >= 60, n
    assert not failures, "\n".join(failures)


def test_the_link_check_catches_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Batches (`--batch-size`)\n\n## Batches (`--batch-size`)\n")
    page = tmp_path / "page.md"
    text = ("[ok](other.md) [ok](other.md#batches---batch-size) [ok](other.md#batches---batch-size-1) "
            "[ok](#a-heading) [web](https://example.org/x) `[not a link](nowhere.md)`\n\n# A heading\n\n"
            "[gone](missing.md) [bad anchor](other.md#batches) [bad local](#no-such)\n\n"
            "```bash\necho [in code](nowhere.md)\n```\n")
    page.write_text(text)
    assert broken_links(page, text) == ["missing.md: no such file",
                                        "other.md#batches: no heading with anchor #batches in other.md",
                                        "#no-such: no heading with anchor #no-such in page.md"]


def test_slug_follows_githubs_rule():
    assert slug("Batches (`--batch-size`)") == "batches---batch-size"
    assert slug("`interdomain-threads/`: interdomain at 1 and 2 threads (issue 14 item 3)") == \
        "interdomain-threads-interdomain-at-1-and-2-threads-issue-14-item-3"
    assert slug("Mistakes caught before anything heavy loads") == "mistakes-caught-before-anything-heavy-loads"


# ------------------------------------------------------------------------------------------- the README

def test_readme_is_a_front_door_of_at_most_15_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail to docs/ (at most {README_MAX_BYTES})"
    assert size > 4_000, size  # control: a README cut to nothing is not a front door either


def test_readme_starts_with_the_two_setup_commands():
    blocks = [body for lang, body, _ in fenced_blocks(README.read_text())]
    assert blocks[:2] == [SETUP_RUN, SETUP_TEST], blocks[:2]
    text = README.read_text()
    assert text.index(SETUP_RUN) < text.index(SETUP_TEST) < text.index("## ")  # before any section


def test_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and f"(docs/{p.name}" not in text]
    assert not missing, f"the README's table of contents lacks {missing}"
    index = (DOCS / "README.md").read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and f"({p.name})" not in index]
    assert not missing, f"docs/README.md lacks {missing}"


def test_every_docs_page_starts_with_an_example():
    # the manual's pages open with a runnable example: after the title comes a fenced code block (at most one
    # lead-in line ending in ':' before it, "Save this as `my_task.py`:")
    for page in sorted(DOCS.glob("*.md")):
        assert opens_with_example(page.read_text()), f"{page.name} does not open with an example"
    assert not opens_with_example("# Title\n\nProse first.\n\n```bash\nlctx run\n```\n")  # control


def opens_with_example(text: str) -> bool:
    lines = [ln for ln in text.splitlines()[1:] if ln.strip() and not ln.startswith("<!--")]
    return bool(lines) and (lines[0].startswith("```") or
                            (lines[0].rstrip().endswith(":") and len(lines) > 1 and lines[1].startswith("```")))


def module_map(text: str) -> list[str]:
    section = text.split("## Module map", 1)[1]
    body = next(body for lang, body, _ in fenced_blocks(section) if lang == "")
    return [line.split()[0] for line in body.splitlines() if line.strip()]


def unmapped_modules(names: list[str], tracked: list[str]) -> list[str]:
    """Tracked Python modules (tests and results aside) that the map names neither by path nor, for a package's
    ``__init__.py``, by its folder, nor by a pattern (``models/position/*.py``: a plug-in folder, one file per
    positional method, where a new method is one file)."""
    listed = set(names)
    patterns = [n for n in names if "*" in n]
    missing = []
    for f in tracked:
        if not f.endswith(".py") or f.startswith(("tests/", "results/", "docs/")):
            continue
        folder = f[: -len("__init__.py")] if f.endswith("/__init__.py") else None
        if f not in listed and folder not in listed and not any(fnmatch.fnmatch(f, p) for p in patterns):
            missing.append(f)
    return missing


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the module map is checked against git ls-files")
    r = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"git ls-files failed: {r.stderr.strip()}")
    return r.stdout.splitlines()


def test_readme_module_map_matches_the_tree():
    names = module_map(README.read_text())
    tracked = _tracked()
    gone = [n for n in names if not (any(REPO.glob(n)) if "*" in n else (REPO / n).exists())]
    assert not gone, f"the README's module map names paths that do not exist: {gone}"
    missing = unmapped_modules(names, tracked)
    assert not missing, f"modules missing from the README's module map: {missing}"
    # control: a new module is caught, and a package's __init__.py counts as its folder
    assert unmapped_modules(names, tracked + ["harness/run/newroom.py"]) == ["harness/run/newroom.py"]
    assert unmapped_modules([n for n in names if n != "harness/run/"], tracked) == ["harness/run/__init__.py"]
    assert unmapped_modules(["models/position/*.py"], ["models/position/yarn.py", "models/x.py"]) == ["models/x.py"]


# ------------------------------------------------------------------------------------------- runnable blocks

def runnable_commands() -> list[tuple[Path, list[str]]]:
    out = []
    for page in doc_files():
        for lang, body, runnable in fenced_blocks(page.read_text()):
            if runnable:
                for line in command_lines(lang, body):
                    out += [(page, args) for args in lctx_invocations(line)]
    return out


@pytest.mark.parametrize("page,args", runnable_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v.name)
def test_runnable_blocks_run(page, args, capsys):
    # only cheap commands are marked runnable (lctx --help, lctx list ...): they run in-process and must succeed
    code, out, err = run_cli(args, capsys)
    assert code == 0, f"{page.name}: lctx {' '.join(args)} exited {code}: {err}"
    assert out.strip(), f"{page.name}: lctx {' '.join(args)} printed nothing"


def test_runnable_marks_are_found():
    assert len(runnable_commands()) >= 3
    text = "<!-- runnable -->\n```bash\nlctx list tasks\n```\n\n```bash\nlctx run\n```\n"
    assert [r for _, _, r in fenced_blocks(text)] == [True, False]


@pytest.mark.usefixtures("plain_console")
def test_readme_lists_every_task_and_the_data_it_needs():
    """Issue 16 item 4: the README names every task and the data files it needs."""
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names)
    from lctx.tasks import TASKS, task_catalog

    readme = (REPO / "README.md").read_text()
    for t in task_catalog():
        if t.name in TASKS and not TASKS[t.name].__module__.startswith("lctx.tasks"):
            continue  # a task file another test loaded
        assert f"`{t.name}`" in readme, t.name
    for path in ("ruler/PaulGrahamEssays.json", "ruler/wonderwords/"):
        assert path in readme


@pytest.mark.usefixtures("plain_console")
def test_readme_gives_the_test_suite_duration():
    """Issue 16: the README's Tests section gives the fast subset's time and links the dated measurements."""
    # the README's Tests section says how long the fast subset takes (a line the lead fills in where the placeholder
    # stands: a measurement, so it is dated) and links the dated measurements of the fast subset and the full suite
    readme = (REPO / "README.md").read_text()
    tests = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert "<!-- fast-subset-time -->" in tests or re.search(r"\d+ (s|min|minutes) of CPU", tests), \
        "no fast-subset time (or its placeholder) in the README's test section"
    link = re.search(r"\]\((results/[^)]*test-suite[^)]*)\)", tests)
    assert link, "the README's test section does not link the measured test-suite durations"
    page = (REPO / link.group(1)).read_text()
    assert re.search(r"about \d+ min", page) and re.search(r"\d{4}-\d{2}-\d{2}", page), link.group(1)
