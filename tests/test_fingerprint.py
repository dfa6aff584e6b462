"""lctx.models.fingerprint: file digests (SHA-256 of the bytes), their on-disk cache, and when a cached entry
is trusted."""

from __future__ import annotations

import json
import os
import time

import pytest

from lctx.models import fingerprint as F

#: every test here runs with no data dir from the environment and its own digest cache (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated_digests")


def test_digest_cache_cannot_hide_a_same_size_same_mtime_rewrite(tmp_path, monkeypatch):
    """Issue 10 item 1: the digest cache re-hashes a file rewritten with its size and mtime kept (its ctime moved)."""
    monkeypatch.setattr(F, "RACY_S", 0.0)  # trust entries at once (normally 2 s after the file's last change)
    calls = []
    real = F._hash_file
    monkeypatch.setattr(F, "_hash_file", lambda p: calls.append(p) or real(p))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    d1 = F.file_digest(f)
    F.flush_cache()
    assert F.file_digest(f) == d1 and len(calls) == 1  # unchanged: served from the cache, not re-read
    st = os.stat(f)
    time.sleep(0.01)
    f.write_bytes(b"b" * 4096)  # same size ...
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... same mtime to the nanosecond
    assert F.file_digest(f) != d1 and len(calls) == 2  # the ctime moved: re-hashed
    assert json.loads((tmp_path / "digests.json").read_text())  # the cache is on disk


def test_racy_cache_entry_is_not_trusted(tmp_path, monkeypatch):
    """Issue 10 item 1: an entry made within RACY_S of the file's last change is not trusted."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    calls = []
    real = F._hash_file
    monkeypatch.setattr(F, "_hash_file", lambda p: calls.append(p) or real(p))
    F.file_digest(f)
    F.file_digest(f)  # hashed within RACY_S of the file's change: the entry could hide a change, so re-read
    assert len(calls) == 2
