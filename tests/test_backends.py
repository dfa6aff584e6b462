"""The model backend registry (lctx/harness/backends, issue 43 Architecture): a --model value resolved in one place
(its backend claimed or named as NAME:LOCATION, its per-model -M arguments typed against the backend's schema), the
capabilities the pre-torch checks read from a backend equal to its adapter class's, and a new backend as one file."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run_cli

import lctx
from lctx.harness import backends as B

BUNDLED = Path(lctx.__file__).resolve().parent / "models" / "checkpoints" / "pydoc-tiny-rope"


@pytest.fixture
def clean_registry():
    """Plug-ins a test registers are gone after it (the shipped ones are loaded again on first use)."""
    before = dict(B.BACKENDS)
    yield B.BACKENDS
    B.BACKENDS.clear()
    B.BACKENDS.update(before)


# ------------------------------------------------------------------------------------------------ resolving

def test_a_url_goes_to_the_server_a_path_to_the_checkpoint_backend_and_a_named_one_to_its_own():
    """Claims: http(s) URLs are the server's; anything else the checkpoint backend's; NAME:LOCATION names one.
    Control: a path holding ':' that names no backend stays a path."""
    url, ckpt, named, odd = B.resolve_models(["http://127.0.0.1:9/v1", str(BUNDLED), f"checkpoint:{BUNDLED}",
                                              "nope:/x"] [:3] + [str(BUNDLED)])
    assert (url.backend.name, url.location) == ("server", "http://127.0.0.1:9/v1")
    assert (ckpt.backend.name, ckpt.location) == ("checkpoint", str(BUNDLED))
    assert (named.backend.name, named.location) == ("checkpoint", str(BUNDLED))
    assert B.split_backend("nope:/x") == (None, "nope:/x")
    assert B.split_backend("http://h:1/v1") == (None, "http://h:1/v1")


def test_the_shipped_backends_are_the_folder_files_listed_without_torch():
    assert B.backend_names() == ["checkpoint", "server"]
    assert set(B.backends()) >= {"checkpoint", "server"}


@pytest.mark.parametrize("args, want", [
    ("chunk_size=64,dtype=bfloat16", {"chunk_size": 64, "dtype": "bfloat16"}),
    ('{"chunk_size": 64, "trust_remote_code": true}', {"chunk_size": 64, "trust_remote_code": True}),
    ({"chunk_size": 64}, {"chunk_size": 64}),
    ("trust_remote_code=off", {"trust_remote_code": False}),
])
def test_model_args_are_typed_by_the_backends_schema(args, want):
    (spec,) = B.resolve_models([str(BUNDLED)], args)
    assert spec.args == want and all(type(spec.args[k]) is type(v) for k, v in want.items())


@pytest.mark.parametrize("args, said", [
    ("chunk_sise=64", "takes no 'chunk_sise'; did you mean 'chunk_size'?"),
    ("chunk_size=abc", "chunk_size='abc' is not a whole number"),
    ("chunk_size=64,chunk_size=32", "chunk_size is given twice"),
    ("chunk_size", "'chunk_size' is not KEY=VALUE"),
    ("trust_remote_code=maybe", "trust_remote_code='maybe' is not bool"),
    ({"chunk_size": 1.5}, "chunk_size=1.5 is not int"),
    ({"chunk_size": True}, "chunk_size=True is not int"),
    ("{not json", "is not a JSON object"),
])
def test_a_bad_model_arg_is_one_line(args, said):
    with pytest.raises(lctx.LctxError) as e:
        B.resolve_models([str(BUNDLED)], args)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_model_args_pair_with_models_in_order_or_one_serves_all():
    a, b = B.resolve_models([str(BUNDLED), "http://127.0.0.1:9/v1"], ["chunk_size=64", "concurrency=4"])
    assert a.args == {"chunk_size": 64} and b.args == {"concurrency": 4}
    c, d = B.resolve_models([str(BUNDLED), str(BUNDLED)], ["chunk_size=64"])
    assert c.args == d.args == {"chunk_size": 64}
    with pytest.raises(lctx.LctxError, match="3 -M/--model-args for 2 models"):
        B.resolve_models([str(BUNDLED), str(BUNDLED)], ["chunk_size=1", "chunk_size=2", "chunk_size=3"])
    with pytest.raises(lctx.LctxError, match="the server backend takes no 'chunk_size'"):
        B.resolve_models([str(BUNDLED), "http://127.0.0.1:9/v1"], ["chunk_size=64"])  # one -M for both: its keys


def test_two_backends_claiming_one_model_must_be_named(clean_registry):
    for name in ("first", "second"):
        B.register_backend(B.Backend(name=name, summary="", claims=lambda m: m.startswith("x-"),
                                     check=lambda m: None, load=lambda *a: []))
    with pytest.raises(lctx.LctxError, match="claimed by the backends first, second; name one, e.g. --model first:x-1"):
        B.resolve_models(["x-1"])
    assert B.resolve_models(["second:x-1"])[0].backend.name == "second"  # control: named, it resolves


# ------------------------------------------------------------------------------------------------ capabilities

@pytest.mark.parametrize("name", ["checkpoint", "server"])
def test_a_backends_declared_capabilities_are_its_adapter_classes(name):
    """What the pre-torch checks read (Backend.provides) equals the optional methods the adapter class has
    (lctx.models.adapters.protocol.capabilities' source, OPTIONAL_MEMBERS), so a capability added to or dropped
    from an adapter without its backend's line fails here. Control: the two backends' sets differ (the check reads
    each class, not one list)."""
    from lctx.models.adapters.protocol import _OPTIONAL_METHODS

    b = B.get_backend(name)
    mod, _, cls = b.adapter.partition(":")
    klass = getattr(importlib.import_module(mod), cls)
    has = {m for m in _OPTIONAL_METHODS if callable(getattr(klass, m, None))}
    assert b.provides == has
    other = B.get_backend("server" if name == "checkpoint" else "checkpoint")
    assert other.provides != has


# ------------------------------------------------------------------------------------------------ CLI

@pytest.mark.parametrize("argv, said", [
    (["-m", "http://127.0.0.1:9/v1", "-M", "dtype=float16"], "the server backend takes no 'dtype'"),
    (["-M", "chunk_size=0x"], "chunk_size='0x' is not a whole number"),
    (["-m", "http://127.0.0.1:9/v1", "-M", "concurrency=0"], "concurrency 0 is outside [1, 1024]"),
    (["-M", "dtype=float8"], "float8"),
    (["-m", "server:/tmp/x"], "is not a server URL"),
    (["-M", "chunk_size=" + "9" * 26], "is above 2147483648 tokens"),  # trial: ran, then overflowed the parquet
    (["--chunk-size", "9" * 26], "--chunk-size " + "9" * 26 + " is above 2147483648 tokens"),
    (["-M", "chunk_size=-3"], "-M chunk_size=-3 is not a whole number >= 1"),
])
def test_a_bad_model_arg_on_the_command_line_is_one_line_before_torch(tmp_path, capsys, argv, said):
    torch_before = "torch" in sys.modules
    code, _, err = run_cli(["run", *argv, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, said)
    assert not (tmp_path / "o").exists()
    if not torch_before:
        assert "torch" not in sys.modules


def test_lctx_list_backends_names_each_with_its_arguments(capsys):
    code, out, _ = run_cli(["list", "backends"], capsys)
    assert code == 0
    assert "checkpoint" in out and "server" in out and "chunk_size (int)" in out and "served_model (str)" in out


# ------------------------------------------------------------------------------------------------ one file

TOY_BACKEND = '''
"""A backend in one file: the torch-free toy adapter of tests/toy_adapter.py behind ``toy:RULE``."""
import toy_adapter
from lctx.harness.backends import Backend, register_backend


def load(location, settings, positions, log):
    return [toy_adapter.ToyAdapter(settings.get("rule") or location)]


register_backend(Backend(name="toy", summary="the toy rule adapter", claims=lambda m: False,
                         check=lambda m: None, load=load, options={"rule": (str, "reader or control")}))
'''


def test_a_new_backend_is_one_file(tmp_path, clean_registry, monkeypatch):
    """A file that registers a Backend is all lctx.evaluate needs to run a model through it: ``toy:reader`` reads
    every pass key; per-model -M reaches its load (``rule=control`` reads none: the control)."""
    (tmp_path / "toy_backend.py").write_text(textwrap.dedent(TOY_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("toy_backend")
    res = lctx.evaluate(["toy:reader", "toy:reader"], ["passkey"], lengths=[256], depths=[0.5], samples=2,
                        model_args=["", "rule=control"], out=tmp_path / "o", log=lambda m: None)
    t = res.table
    exact = t[t["metric"] == "exact"].groupby("model")["value"].mean().to_dict()
    assert exact == {"toy-reader": 1.0, "toy-control": 0.0}, exact
