"""``spanlab run``: N worker processes on one store.

DuckDB lets one process write the file, so with a ``store.path`` this process opens the store and
serves it over HTTP on a private loopback port, and the workers (separate processes, so agents
really run in parallel) talk to it through ``StoreClient``. With ``store.url`` the workers connect
to that store server directly: that is how workers on other machines join.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
from dataclasses import asdict

from spanlab.config import RunConfig
from spanlab.runner.agent import load_agent
from spanlab.runner.worker import Worker, WorkerStats
from spanlab.store.base import StoreAPI
from spanlab.store.client import StoreClient
from spanlab.threaded_server import ThreadedServer

logger = logging.getLogger(__name__)


def run_worker(config: RunConfig, store: StoreAPI, worker_id: str | None = None) -> WorkerStats:
    agent = load_agent(config.agent.name, config.agent.kwargs)
    r = config.runner
    worker = Worker(store, agent, worker_id=worker_id, gateway_url=config.gateway.url, concurrency=r.concurrency,
                    heartbeat_s=r.heartbeat_s, poll_s=r.poll_s, mode=r.mode, exit_when_idle=r.exit_when_idle,
                    gateway_token=config.gateway.token)
    return asyncio.run(worker.run())


def _worker_process(config_json: str, url: str, token: str | None, index: int, results: mp.Queue) -> None:
    logging.basicConfig(level=logging.INFO, format=f"[worker {index}] %(levelname)s %(name)s: %(message)s")
    config = RunConfig.model_validate_json(config_json)
    with StoreClient(url, token=token) as store:
        stats = run_worker(config, store, worker_id=f"worker-{index}")
    results.put(asdict(stats))


def run_pool(config: RunConfig, workers: int | None = None) -> WorkerStats:
    """Run ``workers`` worker processes (default: the config's) until the queue is drained."""
    n = workers or config.runner.workers
    load_agent(config.agent.name, config.agent.kwargs)  # fail here, not in N children
    server = None
    store = None
    if config.store.path is not None:
        from spanlab.store import SpanStore
        from spanlab.store.server import create_store_app

        store = SpanStore(config.store.path)
        token = None
        server = ThreadedServer(create_store_app(store), name="store").start()
        url = server.url
    else:
        url, token = config.store.url, config.store.token
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_worker_process, args=(config.model_dump_json(), url, token, i, results))
             for i in range(n)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        if server is not None:
            server.stop()
        if store is not None:
            store.close()
    total = WorkerStats()
    while not results.empty():
        for key, value in results.get().items():
            setattr(total, key, getattr(total, key) + value)
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    if failed:
        logger.error("%d of %d workers exited abnormally (exit codes %s)", len(failed), n, failed)
    return total
