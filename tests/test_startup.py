"""Start-up cost (issues 14.5 and 15.4): the CLI's help, listings and one-line errors import neither the
transformers modeling stack nor lm-eval nor triton (nor pandas / matplotlib); ``import lctx.models`` still
registers the model with transformers' Auto classes. Each check runs in a fresh interpreter, so modules
other tests imported cannot hide an import."""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

HEAVY = ("transformers", "lm_eval", "triton", "pandas", "matplotlib")


def _fresh(code: str, cwd=None, env: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _imported_after(stmt: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    code = (f"import sys, json\n{stmt}\n"
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")
    return _fresh(code)


def _cli(args: list[str]) -> str:
    return (f"from lctx.cli import main\nimport contextlib, io\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    main({args!r})")


# Not even torch: the task listing reads class attributes only (the tasks import lctx.models, whose package
# imports torch and transformers, on first use; the derived names' modules import pandas on first use), and
# these mistakes are answered before anything computes (issue 15.4). One interpreter runs them in turn and
# notes what each added (modules only accumulate, so a clean list after each means each alone is clean): one
# start-up instead of one per command keeps this in the fast subset.
LIGHTEST = {"list-tasks": ["list", "tasks"], "list-metrics": ["list", "metrics"], "help": ["--help"],
            "bad-length": ["run", "--lengths", "1.5k"],
            "bad-task": ["run", "--tasks", "pasky"], "bad-model": ["run", "--model", "/no/such/checkpoint"],
            "bad-list": ["list", "nothing"], "plan-bad-length": ["plan", "--length", "1.5k"],
            "zero-samples": ["run", "--samples", "0"],
            # trial21 (item 7): these loaded torch (10-13 s) before their error line
            "plan-bad-model": ["plan", "--model", "/no/such/checkpoint"], "plan-bad-dtype": ["plan", "--dtype", "fp8"],
            "bad-dtype": ["run", "--dtype", "float8"], "bad-device": ["run", "--device", "tpu"],
            "bad-attn-impl": ["run", "--attn-impl", "foo"], "bad-attn-override": ["run", "--attn-override", "foo"],
            "bad-relative": ["run", "--relative", "0"], "bad-train-length": ["run", "--train-length", "0"],
            "model-is-a-file": ["run", "--model", str(Path(__file__).resolve())],
            "far-mass-bad-length": ["diagnose", "far-mass", "-m", "/no/such/checkpoint", "--lengths", "abc"],
            "far-mass-bad-model": ["diagnose", "far-mass", "-m", "/no/such/checkpoint"]}


def test_cli_listing_tasks_and_one_line_errors_import_not_even_torch(tmp_path):
    heavy = HEAVY + ("torch",)
    code = ["import sys, json, contextlib, io", "seen = {}", "import lctx.cli",
            f"seen['import'] = sorted(m for m in {heavy!r} if m in sys.modules)", "from lctx.cli import main"]
    for name, args in LIGHTEST.items():
        code += ["with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):",
                 f"    rc = main({args!r})",
                 f"seen[{name!r}] = [rc, sorted(m for m in {heavy!r} if m in sys.modules)]"]
    code.append("print(json.dumps(seen))")
    seen = _fresh("\n".join(code), cwd=tmp_path)
    assert seen.pop("import") == []
    assert seen == {name: [0 if name in ("list-tasks", "list-metrics", "help") else 2, []] for name in LIGHTEST}
    assert not list(tmp_path.iterdir())  # a refused run leaves nothing behind


def _bundled_copy(dest: Path, **config) -> Path:
    """A copy of the bundled checkpoint with ``config`` changed in its config.json (no torch)."""
    import shutil

    from lctx.harness.evaluate import DEFAULT_MODEL

    shutil.copytree(DEFAULT_MODEL, dest)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, **config}))
    return dest


def _refused_before_torch(cases: dict, argv, cwd, env: dict | None = None) -> None:
    """Run ``lctx.cli.main(argv(args))`` for every case {name: (args, needle)} in one fresh interpreter and
    assert each exits 2 with one ``error:`` line holding its needle, torch never imported."""
    code = ["import sys, json, contextlib, io", "seen = {}", "from lctx.cli import main"]
    for name, (args, _) in cases.items():
        code += ["err = io.StringIO()", "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):",
                 f"    rc = main({argv(args)!r})",
                 f"seen[{name!r}] = [rc, 'torch' in sys.modules, err.getvalue().strip()]"]
    code.append("print(json.dumps(seen))")
    seen = _fresh("\n".join(code), cwd=cwd, env=env)
    for name, (_, needle) in cases.items():
        rc, torch_loaded, err = seen[name]
        assert (rc, torch_loaded) == (2, False), (name, err)
        assert err.startswith("error: ") and len(err.splitlines()) == 1 and needle in err, (name, err)


def test_checks_that_need_no_model_answer_before_torch_loads(tmp_path):
    """Issue 24.6: these mistakes were answered after torch, the tasks and the weights had loaded (15-31 s; a
    missing tokenizer as transformers' "Couldn't instantiate the backend tokenizer from one of: "). Each is now one
    line before torch is imported, in one fresh interpreter (as above). CUDA_VISIBLE_DEVICES="" hides any GPU, so
    --device cuda has none to find on every machine; HF_HUB_CACHE points at an empty cache."""
    from gguf_tiny import write_tiny_gguf

    ck = _bundled_copy(tmp_path / "ck256", max_position_embeddings=256)
    no_tok = _bundled_copy(tmp_path / "no-tok")
    (no_tok / "tokenizer.json").unlink()
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", ctx=128)
    no_txt = tmp_path / "no-txt"
    no_txt.mkdir()
    out = str(tmp_path / "out")
    cases = {"cuda": (["run", "--device", "cuda"], "no CUDA GPU; use --device cpu"),
             "cuda-1": (["run", "--device", "cuda:1"], "no CUDA GPU; use --device cpu"),
             "option-key": (["run", "--task-option", "passkey.nosuch=1"], "task 'passkey' has no option 'nosuch'"),
             "option-task": (["run", "--task-option", "niah_single_1.match=digits"], "which is not in --tasks"),
             "derived-option": (["run", "--tasks", "flatness", "--task-option", "flatness.nosuch=1"], "nosuch"),
             "beyond-max": (["run", "-m", str(ck), "--lengths", "128,4k"], "length 4096 exceeds the 256 tokens"),
             "window-beyond-max": (["run", "-m", str(ck), "--tasks", "ppl", "--lengths", "128", "--window", "1k"],
                                   "length 1024 exceeds the 256 tokens model 'ck256'"),
             "gguf-beyond-max": (["run", "-m", str(gguf), "--lengths", "256"], "exceeds the 128 tokens model 'tiny'"),
             "no-tokenizer": (["run", "-m", str(no_tok)], "has no tokenizer (no tokenizer.json"),
             "hub-id-not-cached": (["run", "-m", "HuggingFaceTB/SmolLM2-135M-Instruct"], "lctx does not download"),
             # issue 25, F5: ran 60 s to 6.6 GB, then pyarrow's OverflowError; with the memory check, after the model
             "huge-length": (["run", "--lengths", "99999999999999999999", "--no-memory-check"],
                             "length 99999999999999999999 is above 2147483648 tokens"),
             "huge-train-length": (["run", "--train-length", str(2**31 + 1)], "--train-length 2147483649 is above"),
             # issue 25, F6: the first NIAH sample failed with NotADirectoryError, exit 3
             "cache-dir-file": (["run", "--tasks", "niah_single_1", "--cache-dir", str(Path(__file__).resolve())],
                                "cannot write to --cache-dir"),
             "cache-dir-under-file": (["run", "--cache-dir", str(Path(__file__).resolve() / "c")],
                                      "is a file); pass a writable directory"),
             # issue 25 item 4: the task objects' own checks of these came after torch loaded (40-150 s when busy)
             "stride-zero": (["run", "--stride", "0"], "bad --stride for task 'ppl': stride must be a positive"),
             "stride-inf": (["run", "--stride", "inf"], "bad --stride for task 'ppl'"),  # was OverflowError
             "stride-past-window": (["run", "--tasks", "ppl", "--lengths", "256,1k", "--stride", "300"],
                                    "stride 300 is longer than the shortest window (256 tokens"),
             "option-stride-past-window": (["run", "--tasks", "ppl", "--relative", "1", "--window", "128",
                                            "--task-option", "ppl.stride=200"],
                                           "bad --task-option ppl.stride for task 'ppl': stride 200 is longer"),
             "huge-window": (["run", "--tasks", "ppl", "--relative", "1", "--window", "4096m"],
                             "--window 4294967296 is above 2147483648 tokens"),
             "max-tokens": (["run", "--ppl-max-tokens", "-1"], "bad --ppl-max-tokens for task 'ppl'"),
             "key-digits": (["run", "--key-digits", "40"], "key_digits=40 is above 30 digits"),
             "max-new-tokens": (["run", "--task-option", "passkey.max_new_tokens=0"],
                                "bad --task-option passkey.max_new_tokens"),
             "niah-match": (["run", "--tasks", "niah_single_1", "--task-option", "niah_single_1.match=foo"],
                            "match='foo' is not a match mode"),
             "vt-hops": (["run", "--tasks", "vt", "--task-option", "vt.num_hops=0"], "num_hops=0 is not a positive"),
             "niah-data": (["run", "--tasks", "niah_single_1", "--data-dir", str(tmp_path)],
                           "not found under data dir"),
             "ppl-data": (["run", "--tasks", "ppl", "--ppl-data", str(tmp_path / "none.txt")], "does not exist"),
             "ppl-data-no-txt": (["run", "--tasks", "ppl", "--ppl-data", str(no_txt)], "holds no *.txt")}
    _refused_before_torch(cases, lambda args: args + ["--out", out], tmp_path,
                          env={"CUDA_VISIBLE_DEVICES": "", "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert not (tmp_path / "out").exists()


def test_train_numbers_are_checked_before_torch_loads(tmp_path):
    """Issue 25 item 4: lctx train's numbers were checked by train() once torch and transformers had loaded (and the
    corpus was read); each is now one line before torch, the same check (args.check_train_args) train() runs."""
    cases = {"steps": (["--steps", "0"], "steps must be a positive integer, got 0; pass a value >= 1 (--steps)"),
             "context": (["--context-length", "1"], "context_length must be at least 2"),
             "huge-context": (["--context-length", str(2**31 + 1)], "is above 2147483648 tokens"),
             "heads-divide": (["--hidden-size", "30", "--heads", "4"],
                              "hidden_size 30 is not divisible by num_heads 4"),
             "vocab": (["--vocab-size", "100"], "vocab_size 100 is too small (--vocab-size); pass at least 259"),
             "batch": (["--batch-size", "0"], "batch_size must be a positive integer"),
             "lr": (["--lr", "nan"], "lr must be a positive number, got nan"),
             "warmup": (["--warmup", "-1"], "warmup_steps must be a non-negative integer"),
             "val": (["--val-fraction", "1"], "val_fraction must be in (0, 1)"),
             # a negative fraction was dropped silently (no RetrievalMix below 0), 1.5 refused after torch
             "retrieval-negative": (["--retrieval-fraction", "-0.5"], "retrieval fraction must be in [0, 1]"),
             "retrieval-above-1": (["--retrieval-fraction", "1.5"], "retrieval fraction must be in [0, 1]"),
             "retrieval-min": (["--retrieval-fraction", "0.5", "--retrieval-min-length", "0"],
                               "retrieval_min_length must be a positive number of tokens")}
    out = str(tmp_path / "ck")
    _refused_before_torch(cases, lambda args: ["train", *args, "--out", out], tmp_path)
    assert not (tmp_path / "ck").exists()


def test_evaluate_checks_lmeval_settings_before_torch_loads(tmp_path):
    """Issue 25 item 4: ``lctx.evaluate(limit=0)`` (the CLI's typer bounds do not reach the Python API) was refused by
    lm-eval's task builder, after torch loaded."""
    code = ["import sys, json", "import lctx", "seen = {}"]
    for name, kw in {"limit": "limit=0", "fewshot": "num_fewshot=-1"}.items():
        code += ["try:", f"    lctx.evaluate(None, 'mmlu', data_dir={str(tmp_path)!r}, out={str(tmp_path / 'o')!r},"
                         f" {kw})",
                 "except lctx.LctxError as e:", f"    seen[{name!r}] = [str(e), 'torch' in sys.modules]"]
    code.append("print(json.dumps(seen))")
    seen = _fresh("\n".join(code), cwd=tmp_path)
    assert seen == {"limit": ["--limit 0 is not a positive number of questions; pass e.g. --limit 20", False],
                    "fewshot": ["--num-fewshot -1 is negative; pass 0 or more", False]}


@pytest.mark.parametrize("args", [["list", "variants"], ["bench", "--lengths", "1.5k"],
                                  ["train", "--variant", "ropee", "--out", "unused"],
                                  # last stop's finding: a misspelt variant loaded transformers and triton (10 s)
                                  ["bench", "--variants", "rope,ropee", "--out", "unused"]])
@pytest.mark.slow
def test_cli_variant_listing_and_checks_stay_light(args):
    assert _imported_after(_cli(args)) == []


@pytest.mark.slow
def test_a_checkpoint_loads_after_the_light_variant_listing(tmp_path):
    # `lctx list variants` imports lctx.models without registering model_type "lctx" with transformers; a
    # checkpoint loaded later in the same process must still find it (load_lm registers it itself).
    code = (_cli(["list", "variants"]) + "\nimport json\nfrom lctx.harness.evaluate import DEFAULT_MODEL\n"
            "from lctx.models.adapters.hf import load_lm\nlm = load_lm(str(DEFAULT_MODEL), device='cpu')\n"
            "print(json.dumps(type(lm.model).__name__))")
    assert _fresh(code) == "LctxForCausalLM"


@pytest.mark.slow
def test_import_lctx_models_still_registers_with_transformers():
    code = ("import json, lctx.models\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
            "cfg = AutoConfig.for_model('lctx', variant='alibi', hidden_size=32, num_attention_heads=4, "
            "num_hidden_layers=1, vocab_size=50)\n"
            "m = AutoModelForCausalLM.from_config(cfg)\n"
            "print(json.dumps([type(cfg).__name__, type(m).__name__]))")
    assert _fresh(code) == ["LctxConfig", "LctxForCausalLM"]
