"""lctx.model_files: what a checkpoint path holds, checked before a model loads: remote code refused unless
--trust-remote-code, a llama2.c folder pointed at `lctx convert llama2c`, a config's max_position_embeddings
that is not a positive number."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import assert_one_line_error, edited_checkpoint, run_cli

#: every test here runs with no data dir from the environment and its own digest cache (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated_digests")


def remote_code_checkpoint(tmp_path) -> tuple[Path, Path]:
    d = tmp_path / "remote"
    d.mkdir()
    marker = tmp_path / "REMOTE_CODE_RAN"
    (d / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_lctx_test'\n")
    (d / "config.json").write_text(json.dumps({"model_type": "evil_lctx_test", "hidden_size": 64,
                                               "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    return d, marker


@pytest.mark.parametrize("cmd", [["plan", "--model", "{d}", "--length", "1k"],
                                 ["run", "--model", "{d}", "--tasks", "passkey", "--lengths", "160"],
                                 ["diagnose", "far-mass", "--model", "{d}", "--lengths", "256"],
                                 ["diagnose", "prior", "--model", "{d}"],
                                 ["bench", "--model", "{d}", "--lengths", "64"]])  # bench --model came later
def test_remote_code_is_refused(tmp_path, capsys, cmd, monkeypatch):
    """Issue 10 item 14: every command that reads a checkpoint refuses its remote code unless --trust-remote-code."""
    d, marker = remote_code_checkpoint(tmp_path)
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # nobody to answer a prompt
    args = [str(d) if a == "{d}" else a for a in cmd] + ["--out", tmp_path / "o"] * (cmd[0] != "plan")
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "--trust-remote-code")
    assert not marker.exists()


def test_nonpositive_max_position_embeddings(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 16: max_position_embeddings <= 0 in config.json is one line naming the key."""
    ck = edited_checkpoint(make_checkpoint, max_position_embeddings=-5)
    code, _, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--out", tmp_path / "o"],
                           capsys)
    assert_one_line_error(code, err, "max_position_embeddings = -5", "not a positive number")
    assert "<= -5" not in err


def test_llama2c_folder_points_at_convert(capsys, tmp_path):
    """Trial 21 item 2: a llama2.c folder given as --model points at lctx convert llama2c and its files."""
    d = tmp_path / "stories"
    d.mkdir()
    (d / "stories260K.bin").write_bytes(b"\0" * 64)  # llama2.c's layout: model .bin + tokN.bin
    (d / "tok512.bin").write_bytes(b"\0" * 64)
    code, _, err = run_cli(["run", "--model", d, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "lctx convert llama2c", "stories260K.bin", "--tokenizer", "tok512.bin")
