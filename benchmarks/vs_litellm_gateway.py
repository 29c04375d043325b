"""Side by side: latency added in front of an engine by spanlab's gateway and by a LiteLLM proxy (issue #10).

Three paths to the same engine:

* direct: the client calls the engine's ``/v1/chat/completions``;
* spanlab: through ``python -m spanlab.gateway`` (./.venv) recording every call, with its exact token IDs and
  logprobs, into a DuckDB file in a temp folder (per-call mode, no TITO);
* LiteLLM: through ``litellm --config`` (LiteLLM proxy from ./.venv-bench, ``scripts/bench_env.sh``) configured
  as a plain OpenAI-compatible passthrough to the same engine: one model entry (``openai/<model>`` with
  ``api_base``), no database, no callbacks or logging, local model-cost map (no network); a random master key
  (the proxy refuses to start without one), sent as the bearer token.

``--engine fake`` (default): the fast fake engine of ``gateway_overhead.py`` (started here as a subprocess with
its ``--serve-engine``; a real HTTP server answering vLLM's protocol, token IDs and logprobs included, with a
canned response), so what shows is each proxy's own cost, like for like. ``--engine vllm``: the shared vLLM at
``--upstream`` (never started or stopped here), whose generation jitter (seconds) hides both proxies' costs.

The same chat request on every path, one call at a time, after --warmup calls per path; each round calls the
three paths once, in an order that rotates each round, so all see the same engine and machine load (an httpx
client, so "direct" includes more client time than gateway_overhead.py's aiohttp figures). Then
(default for fake) ``--concurrency`` agents call each path for ``--seconds`` (calls/s answered). Checks that
both proxies returned the engine's content (and token IDs, when asked for them) and, after the gateway is
stopped, counts the spans in its DuckDB file. Reports per path p50/p90/p99 latency, the added latency vs direct
(difference of medians, median of the per-round paired differences, difference of p99s), calls/s, and each
proxy process's peak RSS and CPU ms per call served after start-up. Repeats --reps times; medians over reps.

Run: bash scripts/bench_env.sh   (once)
     .venv/bin/python benchmarks/vs_litellm_gateway.py [--engine fake|vllm] [--reps 3] [--n N] [--warmup W]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import gateway_overhead as go  # the sibling script (benchmarks/ is sys.path[0] when run as a script)
import httpx

ROOT = Path(__file__).resolve().parents[1]
BENCH_BIN = ROOT / ".venv-bench" / "bin"
HOST = go.HOST
CHAT = "/v1/chat/completions"
log = logging.getLogger("vs_litellm_gateway")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _up(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait for ``url``; a process that never comes up is stopped, not left behind."""
    try:
        go._wait_up(url, proc, timeout=timeout)
    except BaseException:
        proc.kill()
        raise


def start_fake_engine(n_prompt: int, n_resp: int, logfile: Path) -> tuple[subprocess.Popen, str]:
    port = go._free_port()
    cmd = [sys.executable, go.__file__, "--serve-engine", str(port)]
    cmd += ["--prompt-tokens", str(n_prompt), "--response-tokens", str(n_resp)]
    proc = subprocess.Popen(cmd, stdout=logfile.open("w"), stderr=subprocess.STDOUT)
    _up(f"http://{HOST}:{port}/v1/models", proc)
    return proc, f"http://{HOST}:{port}"


def start_spanlab(upstream: str, db: Path, logfile: Path) -> tuple[subprocess.Popen, str]:
    port = go._free_port()
    cmd = [sys.executable, "-m", "spanlab.gateway", "--upstream", upstream, "--db", str(db)]
    cmd += ["--host", HOST, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=logfile.open("w"), stderr=subprocess.STDOUT)
    _up(f"http://{HOST}:{port}/health", proc)
    return proc, f"http://{HOST}:{port}"


def start_litellm(upstream: str, model: str, tmp: Path, key: str) -> tuple[subprocess.Popen, str]:
    cfg = tmp / "litellm.yaml"
    params = {"model": f"openai/{model}", "api_base": f"{upstream}/v1", "api_key": "none"}
    cfg.write_text(
        json.dumps(  # JSON is YAML
            {
                "model_list": [{"model_name": model, "litellm_params": params}],
                "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
                "general_settings": {},
            }
        )
    )
    port = go._free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY")}
    # the proxy refuses to start without a master key (requests then carry it as a bearer token); no DB behind it
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "PYTHONWARNINGS": "ignore"}
    env["LITELLM_MASTER_KEY"] = key
    cmd = [str(BENCH_BIN / "litellm"), "--config", str(cfg), "--host", HOST, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=(tmp / "litellm.log").open("w"), stderr=subprocess.STDOUT, env=env)
    _up(f"http://{HOST}:{port}/health/liveliness", proc, timeout=300)
    return proc, f"http://{HOST}:{port}"


def post(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.post(url + CHAT, json=body, headers=headers)
    ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return ms, r.json()


def check_passthrough(paths: dict[str, str], body: dict[str, Any], headers: dict[str, dict[str, str]]) -> list[str]:
    """One plain call and one asking ``return_token_ids`` per path; what each proxy returned vs direct."""
    got: dict[str, tuple[Any, ...]] = {}
    with httpx.Client(timeout=300) as client:
        for name, url in paths.items():
            plain = post(client, url, body, headers.get(name, {}))[1]
            ids = post(client, url, body | {"return_token_ids": True}, headers.get(name, {}))[1]
            ids_choice = ids["choices"][0]
            content = plain["choices"][0]["message"]["content"]
            got[name] = (content, ids_choice.get("token_ids"), ids.get("prompt_token_ids"))
    d_content, d_ids, d_prompt = got["direct"]
    notes = [f"direct: {len(d_ids or [])} response + {len(d_prompt or [])} prompt token IDs when asked"]
    for name, (content, ids, prompt) in got.items():
        if name != "direct":
            same = "same" if content == d_content else "DIFFERENT"
            tok = "same" if (ids, prompt) == (d_ids, d_prompt) else ("dropped" if ids is None else "DIFFERENT")
            notes.append(f"{name}: content {same} as direct; token IDs when asked: {tok}")
    return notes


def measure(
    paths: dict[str, str], body: dict[str, Any], n: int, warmup: int, headers: dict[str, dict[str, str]]
) -> dict[str, list[float]]:
    ms: dict[str, list[float]] = {p: [] for p in paths}
    lengths: set[int] = set()
    names = list(paths)
    with httpx.Client(timeout=300) as client:
        for _ in range(warmup):
            for name in names:
                post(client, paths[name], body, headers.get(name, {}))
        for i in range(n):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                t, resp = post(client, paths[name], body, headers.get(name, {}))
                ms[name].append(t)
                lengths.add(resp["usage"]["completion_tokens"])
    if len(lengths) != 1:
        log.warning("completion lengths differed between calls: %s", sorted(lengths))
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("fake", "vllm"), default="fake")
    ap.add_argument("--upstream", default="http://127.0.0.1:8765", help="--engine vllm: the running vLLM")
    ap.add_argument("--model", default=None, help="--engine vllm: served model name (default: the engine's first)")
    ap.add_argument("--n", type=int, default=None, help="measured rounds per rep (default 500 fake, 20 vllm)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default 20 fake, 3 vllm)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=None, help="throughput agents (default 32 fake, 0: none)")
    ap.add_argument("--seconds", type=float, default=5.0, help="throughput seconds per path and rep")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="fake engine: prompt token IDs it returns")
    ap.add_argument("--response-tokens", type=int, default=64, help="fake engine: response token IDs it returns")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--db-dir", default=None, help="folder for the gateway's store (default: the temp folder); "
                    "/dev/shm takes the disk's fsync out of the figures")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    fake = args.engine == "fake"
    n = args.n if args.n is not None else (500 if fake else 20)
    warmup = args.warmup if args.warmup is not None else (20 if fake else 3)
    concurrency = args.concurrency if args.concurrency is not None else (32 if fake else 0)
    use_litellm = not args.no_litellm
    if use_litellm and not (BENCH_BIN / "litellm").exists():
        log.warning("no .venv-bench/bin/litellm: run `bash scripts/bench_env.sh`; measuring direct and spanlab only")
        use_litellm = False

    tmp = Path(tempfile.mkdtemp(prefix="vs_litellm_", dir=args.db_dir))
    procs: dict[str, subprocess.Popen] = {}
    headers: dict[str, dict[str, str]] = {}
    calls: dict[str, int] = {}
    t_start = time.perf_counter()
    try:
        if fake:
            procs["engine"], upstream = start_fake_engine(args.prompt_tokens, args.response_tokens, tmp / "engine.log")
            body = go._request(6)  # gateway_overhead.py's request: 6 chat turns, max_tokens 64
            model = body["model"]
        else:
            upstream = args.upstream
            model = args.model or httpx.get(f"{upstream}/v1/models", timeout=10).json()["data"][0]["id"]
            body = {"model": model, "messages": [{"role": "user", "content": "Name three colors of the rainbow."}]}
            body |= {"max_tokens": 16, "temperature": 0}
        paths = {"direct": upstream}
        procs["spanlab"], paths["spanlab"] = start_spanlab(upstream, tmp / "gw.duckdb", tmp / "spanlab.log")
        if use_litellm:
            key = f"sk-{secrets.token_hex(32)}"
            procs["litellm"], paths["litellm"] = start_litellm(upstream, model, tmp, key)
            headers["litellm"] = {"Authorization": f"Bearer {key}"}
        log.info("set-up %.0f s", time.perf_counter() - t_start)
        passthrough = check_passthrough(paths, body, headers)
        calls = {p: 2 for p in paths}
        cpu0 = {p: go._cpu_s(procs[p].pid) for p in paths if p in procs}
        tp = f"concurrency {concurrency} for {args.seconds:g} s per path" if concurrency else "not measured"
        print(
            f"# {args.engine} engine ({model} at {upstream}); {args.reps} reps x {n} rounds (each path once per "
            f"round, rotating order) after {warmup} warm-up rounds; request {len(json.dumps(body))} B, max_tokens "
            f"{body['max_tokens']}, temperature {body['temperature']}; throughput: {tp}; load average {_load()}",
            flush=True,
        )
        reps: list[dict[str, list[float]]] = []
        tput: dict[str, list[float]] = {p: [] for p in paths}
        store_ms: list[dict[str, float]] = []  # the gateway's store writes in its concurrent phase, per rep
        for rep in range(args.reps):
            w = warmup if rep == 0 else max(1, warmup // 10)
            reps.append(measure(paths, body, n, w, headers))
            for p in paths:
                calls[p] += n + w
            names = list(paths)
            for p in (names[rep % len(names) :] + names[: rep % len(names)]) if concurrency else ():
                done, elapsed = asyncio.run(
                    go.throughput(paths[p] + CHAT, json.dumps(body).encode(), concurrency, args.seconds, headers.get(p))
                )
                tput[p].append(done / elapsed)
                calls[p] += done
                if p == "spanlab":
                    store_ms.append(httpx.get(paths[p] + "/health", timeout=10).json()["spans"]["write_ms"])
            line = "  ".join(
                f"{p} p50 {statistics.median(v):.2f} p99 {go._pct(v, 99):.2f} ms"
                + (f" {tput[p][-1]:.0f}/s" if tput[p] else "")
                for p, v in reps[-1].items()
            )
            log.info("rep %d: %s (load %s)", rep, line, _load())
        rss = {p: _peak_rss_mb(procs[p].pid) for p in cpu0}
        cpu_ms = {p: (go._cpu_s(procs[p].pid) - cpu0[p]) * 1000 / (calls[p] - 2) for p in cpu0}
        httpx.post(paths["spanlab"] + "/spanlab/flush", timeout=120).raise_for_status()
        writer = httpx.get(paths["spanlab"] + "/health", timeout=10).json()["spans"]
        _stop(procs)
        with duckdb.connect(str(tmp / "gw.duckdb"), read_only=True) as con:
            stored = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    except Exception:
        for f in sorted(tmp.glob("*.log")):
            log.error("%s (last lines):\n%s", f.name, "\n".join(f.read_text(errors="replace").splitlines()[-20:]))
        raise
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\n# medians over {args.reps} reps; load average now {_load()}")
    if store_ms:
        q = {k: statistics.median(m[k] for m in store_ms) for k in ("p50", "p99", "max")}
        print(f"# spanlab's store write before each answer, its last {store_ms[0]['n']} calls at concurrency "
              f"{concurrency}: p50 {q['p50']:.2f} ms, p99 {q['p99']:.2f} ms, max {q['max']:.2f} ms")
    print("# pass-through: " + "; ".join(passthrough))
    print(
        f"# spanlab recorded: {stored} spans in its DuckDB file (read after the gateway stopped) for "
        f"{calls['spanlab']} calls through it; its span writer: {writer}"
    )
    hdr = f"{'path':8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'+p50':>7} {'paired +p50':>11} {'+p99':>7}"
    print(hdr + f" {'calls/s':>8} {'peak RSS':>9} {'CPU ms/call':>11}")

    def med(f: Any) -> float:
        return statistics.median(f(r) for r in reps)

    d = {q: med(lambda r, q=q: go._pct(r["direct"], q)) for q in (50, 90, 99)}
    for p in reps[0]:
        x = {q: med(lambda r, p=p, q=q: go._pct(r[p], q)) for q in (50, 90, 99)}
        cps = f"{statistics.median(tput[p]):8.0f}" if tput[p] else f"{'':8}"
        row = f"{p:8} {x[50]:8.2f} {x[90]:8.2f} {x[99]:8.2f}"
        if p == "direct":
            print(f"{row} {'':7} {'':11} {'':7} {cps}")
            continue
        paired = med(lambda r, p=p: statistics.median(a - b for a, b in zip(r[p], r["direct"], strict=True)))
        print(
            f"{row} {x[50] - d[50]:+7.2f} {paired:+11.2f} {x[99] - d[99]:+7.2f} {cps} {rss[p]:7.0f}MB {cpu_ms[p]:11.2f}"
        )
    sys.stdout.flush()


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    """SIGTERM (the gateway then writes what it holds and checkpoints its store), and wait."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
