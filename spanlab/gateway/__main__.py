"""Serve the gateway as its own process.

    python -m spanlab.gateway --upstream http://127.0.0.1:8000 --db runs/spans.duckdb --port 9000 [--tito]
    python -m spanlab.gateway --upstream http://127.0.0.1:8000 --store-url http://127.0.0.1:8700 [--store-token T]
    python -m spanlab.gateway --upstream http://127.0.0.1:8000 --upstream http://127.0.0.1:8001 ...  (replicas)

Agents then use ``base_url=http://127.0.0.1:9000/rollout/<rid>/attempt/<aid>/v1``. With ``--db`` the
process holds the DuckDB file read-write (DuckDB allows one such process); with ``--store-url`` it writes
through a store server (``spanlab store serve``), which runners can share. Beyond loopback it needs ``--token``
(or ``--insecure-no-token``); on loopback it answers only loopback Host names.
"""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from spanlab.errors import ConfigError
from spanlab.gateway.app import create_app
from spanlab.gateway.config import GatewayConfig
from spanlab.guards import loopback_hosts
from spanlab.store import SpanStore, StoreAPI
from spanlab.store.client import StoreClient
from spanlab.threaded_server import check_bind, sigterm_exits


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m spanlab.gateway", description=__doc__.splitlines()[0])
    p.add_argument("--upstream", required=True, action="append",
                   help="engine base URL, e.g. http://127.0.0.1:8000; repeat it for replicas (docs/replicas.md)")
    p.add_argument("--db", default=":memory:", help="span store file (default: a throwaway in-memory store)")
    p.add_argument("--store-url", default=None, help="a store server to write to instead of --db")
    p.add_argument("--store-token", default=None, help="the store server's bearer token")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--token", default=os.environ.get("SPANLAB_GATEWAY_TOKEN"),
                   help="a bearer token every call must carry (the agents' api_key; default $SPANLAB_GATEWAY_TOKEN); "
                   "needed beyond loopback")
    p.add_argument("--insecure-no-token", action="store_true", help="allow a bind beyond loopback without --token")
    p.add_argument("--max-body-mb", type=float, default=None,
                   help="largest request body accepted (413 above); default and most: the store's record limit, 16 MiB")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--fallback", default=None, help="JSONL file for spans the store cannot take")
    p.add_argument("--flush-interval", type=float, default=None, help="seconds the writer gathers spans per batch")
    p.add_argument("--tito", action="store_true", help="Token-In Token-Out sessions per attempt (docs/tito.md)")
    p.add_argument("--tokenizer", default=None, help="TITO: the served model's folder (default: the engine's)")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {} if args.flush_interval is None else {"flush_interval_s": args.flush_interval}
    if args.tito:
        overrides.update(tito=True, tokenizer=args.tokenizer)
    try:
        check_bind(args.host, args.token, insecure_no_token=args.insecure_no_token, what="the gateway",
                   token_hint="--token or $SPANLAB_GATEWAY_TOKEN")
    except ConfigError as exc:
        p.exit(2, f"error: {exc}\n")
    config = GatewayConfig(upstream_urls=tuple(args.upstream), fallback_path=args.fallback, token=args.token,
                           max_body_bytes=None if args.max_body_mb is None else int(args.max_body_mb * 1024 * 1024),
                           **overrides)
    with sigterm_exits():  # SIGTERM, like Ctrl-C, unwinds through `with store:`, which closes the store
        store: StoreAPI = StoreClient(args.store_url, token=args.store_token) if args.store_url else SpanStore(args.db)
        with store:
            try:
                app = create_app(store, config=config, hosts=loopback_hosts(args.host))
            except ConfigError as exc:
                p.exit(2, f"error: {exc}\n")
            uvicorn.run(
                app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, proxy_headers=False
            )


if __name__ == "__main__":
    main()
