"""The ``spanlab`` command. Each subcommand is a thin shell over a library function.

Run ``spanlab --help`` for the list.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand

from spanlab import sql_text
from spanlab.compare.command import StartPhase
from spanlab.engine.config import Device as EngineDevice
from spanlab.errors import ConfigError, SpanlabError
from spanlab.store import file_query

app = typer.Typer(
    name="spanlab",
    help="Optimize LLM agents from their own traces: record exact token IDs, query spans with SQL, train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="span store file (default: $SPANLAB_DB, else ./spanlab.duckdb)", show_default=False),
]


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[log_handler(Console(stderr=True))])
    for name in ("httpx", "httpx2"):  # one INFO line per HTTP request is noise here (openai 3.5x logs via httpx2)
        logging.getLogger(name).setLevel(logging.WARNING)


def log_handler(console: Console) -> logging.Handler:
    """Rich's handler on a terminal (colours, and the progress bars draw on its console); a plain one-line-a-record
    handler when stderr is a file or a pipe, where rich would wrap every line at 80 columns, or pad it to its width
    (a run's log file is read with grep and tail, not a terminal)."""
    if console.is_terminal:
        return RichHandler(console=console, show_path=False)
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))
    return handler


def _stderr() -> Console:
    """stderr for one-line messages: never hard-wrapped (a terminal folds a long line itself; a log file or a pipe
    gets it whole, where rich would break it at 80 columns mid-sentence)."""
    return Console(stderr=True, soft_wrap=True)


def _fail(exc: Exception) -> None:
    _stderr().print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
    raise typer.Exit(2)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL to run against the span store (read-only)")],
    db: DbOption = None,
    url: Annotated[str | None, typer.Option("--url", help="query through a store server instead of a file "
                                            "(http://HOST:8700): a store that a running process holds")] = None,
    token: Annotated[str | None, typer.Option(envvar="SPANLAB_STORE_TOKEN", help="the store server's token "
                                              "(--url)")] = None,
    format: Annotated[sql_text.OutputFormat, typer.Option("--format", "-f", help="table | csv | json")] = "table",
    max_rows: Annotated[int, typer.Option(help="rows shown in table format (csv/json print all)")] = 100,
    timeout_s: Annotated[float, typer.Option(help="stop the query after this many seconds (a server applies "
                                                  "its own limits)")] = 300.0,
    max_mb: Annotated[float, typer.Option(help="refuse results larger than this (Arrow size)")] = 1024.0,
) -> None:
    """Query spans with SQL: views llm_calls, rewards, rollout_summary, role_summary, tito_sessions; tables
    rollouts, attempts, spans.

    A file a running process holds (spanlab serve, store serve, train) is queried through its store server:
    spanlab sql --url http://127.0.0.1:8700 [--token T] "SELECT ...".
    """
    try:
        limit = max_rows + 1 if format == "table" else None
        if url is not None:
            if db is not None:
                raise ConfigError("give --db (a file) or --url (a store server), not both")
            from spanlab.store import StoreClient

            # One try: a query typed at a prompt fails at once with one line, where a worker would wait out a
            # restart (a refused port is not worth 5 s of retry warnings).
            with StoreClient(url, token=token, timeout_s=timeout_s, retry_for_s=0.0) as client:
                result = client.query_rows(query, limit if limit is not None else 1_000_000)
        else:
            result = sql_text.json_rows(file_query.run_query(sql_text.resolve_db(db), query, max_rows=limit,
                                                             timeout_s=timeout_s, max_bytes=int(max_mb * 1024 * 1024)))
    except SpanlabError as exc:
        _fail(exc)
        return
    if format == "csv":
        sys.stdout.write(sql_text.to_csv(result))
    elif format == "json":
        sys.stdout.write(sql_text.to_json(result) + "\n")
    else:
        console = Console()
        shown, footer = sql_text.table_view(result, max_rows, console.width)
        for renderable in shown:
            console.print(renderable, markup=False, highlight=False)
        console.print(footer, style="dim", markup=False, highlight=False)


store_app = typer.Typer(help="The span store: serve it over HTTP.", no_args_is_help=True)
app.add_typer(store_app, name="store")


@store_app.command("serve")
def store_serve(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="interface to bind (127.0.0.1 unless workers are remote)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8700,
    max_body_mb: Annotated[float, typer.Option(help="largest request body accepted (413 above)")] = 256.0,
    compress: Annotated[
        bool, typer.Option(help="DuckDB compression (--no-compress: faster ingest, ~1.6x the file size)")
    ] = True,
    token: Annotated[
        str | None, typer.Option(envvar="SPANLAB_STORE_TOKEN", help="require `Authorization: Bearer TOKEN`")
    ] = None,
    insecure_no_token: Annotated[
        bool, typer.Option("--insecure-no-token", help="allow a bind beyond loopback without --token")
    ] = False,
) -> None:
    """Own the DuckDB file and serve the store API (OpenAPI at /docs) to workers in other processes."""
    import uvicorn

    from spanlab.guards import loopback_hosts
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app
    from spanlab.threaded_server import check_bind, sigterm_exits

    try:
        check_bind(host, token, insecure_no_token=insecure_no_token)
        path = sql_text.resolve_db(db)
        # closed after uvicorn stops, on Ctrl-C and SIGTERM too: DuckDB then holds every write
        with sigterm_exits(), SpanStore(path, compress=compress) as store:
            app = create_store_app(store, token=token, max_body_bytes=int(max_body_mb * 1024 * 1024),
                                   hosts=loopback_hosts(host))
            logging.getLogger(__name__).info("store server for %s on http://%s:%d", path, host, port)
            uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    except SpanlabError as exc:
        _fail(exc)


template_app = typer.Typer(help="Chat templates: TITO prefix checks and known fixes.", no_args_is_help=True)
app.add_typer(template_app, name="template")
TokenizerOption = Annotated[
    Path | None, typer.Option("--tokenizer", help="HF tokenizer folder: adds the token-level check", show_default=False)
]


@template_app.command("check")
def template_check(
    template: Annotated[Path, typer.Argument(help="chat template file (.jinja)")],
    tokenizer: TokenizerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")] = False,
) -> None:
    """Is appending a tool message prefix-preserving (TITO)? Exit 0 yes, 1 no, 2 the check could not run.

    Also reports whether tool calls and results render at all, whether a tools list is needed, and the
    stop gap (text after the end-of-turn token that the model never samples).
    """
    from spanlab.tito.templates import TemplateReport, check_template_file, load_tokenizer

    try:
        tok = load_tokenizer(tokenizer) if tokenizer is not None else None
        report = check_template_file(template, tok)
    except SpanlabError as exc:
        report = TemplateReport(template=str(template), error=str(exc))
    if as_json:
        sys.stdout.write(report.model_dump_json() + "\n")
    else:
        from spanlab.tito.view import print_report

        print_report(report, Console())
    raise typer.Exit(report.exit_code)


@template_app.command("fix")
def template_fix(
    template: Annotated[Path, typer.Argument(help="chat template file (.jinja)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write here (default: stdout)")] = None,
    tokenizer: TokenizerOption = None,
) -> None:
    """Apply known one-line fixes (Qwen3's think block), write the result, and re-check it.

    Exit 1 when no known fix applies (nothing is written) or the fixed template still fails the check.
    """
    from spanlab.tito.templates import check_template, fix_template, load_tokenizer
    from spanlab.tito.view import print_verdict

    try:
        text = template.read_text(encoding="utf-8")
        fixed, changes = fix_template(text)
        if not changes:
            _stderr().print(f"no known fix applies to {template}", markup=False, highlight=False,
                                       soft_wrap=True)
            raise typer.Exit(1)
        tok = load_tokenizer(tokenizer) if tokenizer is not None else None
        if out is not None:
            out.write_text(fixed, encoding="utf-8")
        else:
            sys.stdout.write(fixed)
    except (OSError, UnicodeDecodeError, SpanlabError) as exc:
        _fail(exc)
        return
    console = Console(stderr=out is None)  # stdout carries the template when no --out is given
    for change in changes:
        console.print(f"line {change.line} ({change.fix}): {change.before.strip()} -> {change.after.strip()}",
                      markup=False, highlight=False, soft_wrap=True)
    report = check_template(fixed, tok, name=str(out) if out is not None else f"{template} (fixed)")
    print_verdict(report, console)
    raise typer.Exit(report.exit_code)


@app.command()
def drift(
    db: DbOption = None,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="the recorded model's folder (default: the default model)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object instead of tables")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="write a bar chart of rates per cause (PNG)")] = None,
    examples: Annotated[int, typer.Option(help="examples kept per check and cause")] = 3,
) -> None:
    """Retokenization drift of recorded calls: re-encoded responses, and re-rendered next prompts vs the buffer."""
    from spanlab.adapters.recorded_calls import load_calls
    from spanlab.tito.drift import drift_report, plot_report
    from spanlab.tito.templates import load_tokenizer

    try:
        if tokenizer is None:
            from spanlab.engine.model import ensure_default_model

            tokenizer = ensure_default_model()
        report = drift_report(load_calls(sql_text.resolve_db(db)), load_tokenizer(tokenizer), max_examples=examples)
        if plot is not None:
            plot_report(report, plot)
    except SpanlabError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(report.model_dump_json() + "\n")
        return
    out = Table("check", "checked", "differ", "rate", *(c.replace("_", " ") for c in report.response.by_cause))
    for name, check in (("response re-encoded", report.response), ("next prompt re-rendered", report.next_prompt)):
        out.add_row(name, str(check.checked), str(check.differs), f"{check.rate:.1%}",
                    *(f"{c.count} ({c.rate:.1%})" for c in check.by_cause.values()))
    console = Console()
    console.print(out)
    console.print(f"{report.calls} calls; {report.not_extending} consecutive pairs not compared (history rewritten)",
                  style="dim")
    for ex in report.examples:
        console.print(f"{ex.check} {ex.cause} {ex.span_id}: recorded {ex.recorded_text!r} vs re-rendered "
                      f"{ex.rerendered_text!r}", markup=False, highlight=False, soft_wrap=True)


@app.command("serve")
def serve_cmd(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML: db, engine, gateway, store_server")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="serve this model: a trained run's folder "
                                              "(runs/NAME/final), a hub name, or a local folder")] = None,
    device: Annotated[EngineDevice | None, typer.Option(help="the engine's device (default: the config's, else "
                                                      "the installed vLLM build's)", show_default=False)] = None,
    db: Annotated[Path | None, typer.Option("--db", help="span store file the calls are recorded in (default: "
                                            "the config's db, else $SPANLAB_DB, else ./spanlab.duckdb)")] = None,
    port: Annotated[int | None, typer.Option(envvar="SPANLAB_SERVE_PORT", help="the gateway's port (default: "
                                             "the config's gateway.port, else 8800; 0: any free port)")] = None,
    restart_engine: Annotated[bool | None, typer.Option("--restart-engine/--no-restart-engine", help="restart the "
                              "engine if it dies (default: the config's restart_engine, else off: serve then stops, "
                              "non-zero, with the engine's exit status and log tail)", show_default=False)] = None,
) -> None:
    """Start the engine (vLLM), the recording gateway and the span store; print the base URL; Ctrl-C stops all.

    A trained model: spanlab serve --model runs/NAME/final (the line spanlab train prints when it ends).
    """
    from spanlab.config import load_yaml
    from spanlab.serve import serve, serve_config

    try:
        data = load_yaml(config) if config else {}
        if db is None and "db" not in data:
            db = sql_text.resolve_db(None)
        cfg = serve_config(data, model=model, device=device, db=db, port=port, restart_engine=restart_engine,
                           source=str(config) if config else "the command line")
        serve(cfg)
    except SpanlabError as exc:
        _fail(exc)


@app.command()
def run(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML with store, agent, runner, gateway sections")],
    workers: Annotated[int | None, typer.Option(help="worker processes (default: runner.workers)")] = None,
) -> None:
    """Run rollout workers on the store's queue until it is drained."""
    from spanlab.config import RunConfig, load_config
    from spanlab.runner.pool import run_pool

    try:
        cfg = load_config(RunConfig, config)
        stats = run_pool(cfg, workers)
    except SpanlabError as exc:
        _fail(exc)
        return
    Console().print(
        f"attempts: {stats.succeeded} succeeded, {stats.failed} failed, {stats.timeout} timed out, "
        f"{stats.lost} ended by the store"
    )


@app.command()
def demo(
    db: DbOption = None,
    rollouts: Annotated[int | None, typer.Option(help="how many rollouts (default 24 synthetic, 8 live)")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    engine: Annotated[bool, typer.Option("--engine", help="live: the default model on vLLM via the gateway")] = False,
) -> None:
    """A small run written to the store, then summarized.

    Default: synthetic (random token IDs, no model), to show the store, the queue and the SQL views in
    seconds. With --engine: the embedded default model on vLLM answers arithmetic questions through the
    recording gateway (about 2 minutes on CPU).
    """
    try:
        path = sql_text.resolve_db(db)
        if engine:
            from spanlab.demo_live import run_live_demo

            summary = run_live_demo(path, n_rollouts=rollouts or 8, seed=seed)
        else:
            from spanlab.demo import run_demo

            summary = run_demo(path, n_rollouts=rollouts or 24, seed=seed)
    except SpanlabError as exc:
        _fail(exc)
        return
    Console().print(summary)


@app.command()
def train(
    config: Annotated[Path, typer.Argument(help="YAML: algorithm, agent, dataset, engine, db, ... (tutorials/)")],
    steps: Annotated[int | None, typer.Option(help="override the algorithm's step count (grpo.steps, sft.rounds, "
                                                   "apo.rounds; 0: evaluate only)")] = None,
    check: Annotated[bool, typer.Option("--check", help="validate the config and print the resolved settings; "
                                                        "start nothing")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue the run from its last completed step "
                                                          "(runs/NAME/resume/)")] = False,
) -> None:
    """Train an agent's model with the algorithm the config names; prints held-out accuracy before/after.

    Ctrl-C stops the run at any phase (the engine and the rollouts included) and exits 130. A run whose steps
    all made no update (GRPO: no group had reward variance) says so and exits 3.

    Under torchrun (torchrun ... -m spanlab train cfg.yaml) rank 0 runs the job, the other ranks only help its update.
    """
    import yaml

    from spanlab.jobs.config import load_train_config
    from spanlab.jobs.job import build_algorithm, check_job, run_job
    from spanlab.training.launch import torchrun_launch

    try:
        launch = torchrun_launch()
        cfg = load_train_config(config, steps=steps, launch=launch)
        if check:
            from spanlab.jobs.outcome import warm_start_warnings

            _, _, splits = check_job(cfg)
            for level, line in warm_start_warnings(cfg, splits):
                logging.getLogger(__name__).log(level, "%s", line)
            typer.echo(yaml.safe_dump(cfg.shown(), sort_keys=False), nl=False)
            _stderr().print(f"{config}: ok ({cfg.algorithm}); nothing started", markup=False, highlight=False)
            return
        if launch is not None and launch.rank > 0:  # a helper rank: no store, engine or gateway here
            from spanlab.training.data_parallel import serve_torchrun_rank

            build_algorithm(cfg)  # the same config errors as rank 0's, before joining it
            serve_torchrun_rank(cfg.trainer, launch)
            return
        report = run_job(cfg, resume=resume)
    except SpanlabError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        _stderr().print("[bold red]interrupted[/]: the engine and rollouts are stopped", markup=True)
        raise typer.Exit(130) from None
    from spanlab.jobs.outcome import LEARNED_NOTHING_EXIT, end_lines, learned_nothing

    out = Console()
    out.print(report.table())
    if (metrics := report.metrics_table()) is not None:
        out.print(metrics)
    if report.steps:
        out.print(report.curve_table())
    if report.paired_gains():
        out.print(report.gains_table())
    out.print(report.times_table())
    for style, line in end_lines(report, cfg.run_dir):
        out.print(line, style=style or None, markup=False, highlight=False, soft_wrap=True)
    if learned_nothing(report):
        raise typer.Exit(LEARNED_NOTHING_EXIT)


class _RawArgsCommand(TyperCommand):
    """A command that also keeps its raw arguments (``ctx.meta["raw_args"]``): for an option whose values run up
    to the next option (``spanlab compare --arm NAME RUN [RUN ...]``), which click cannot declare."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


@app.command(cls=_RawArgsCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compare(
    ctx: typer.Context,
    start: Annotated[Path, typer.Option("--start", help="the shared start: a run folder or its .duckdb store")],
    arm: Annotated[list[str], typer.Option("--arm", metavar="NAME RUN [RUN ...]", help="an arm's name, then its "
                                           "runs, one per seed (run folders or stores); repeat for each arm")],
    start_phase: Annotated[StartPhase, typer.Option("--start-phase", help="the start's held-out evaluation (base: "
                                                    "a run that evaluated its start model itself)")] = "warm_start",
    reference: Annotated[str | None, typer.Option("--reference", help="the arm the others are compared with "
                                                  "(default: the first)")] = None,
    splits: Annotated[str | None, typer.Option("--splits", help="comma-separated (default: every split the start "
                                               "evaluated)")] = None,
    pool: Annotated[list[str] | None, typer.Option("--pool", metavar="NAME=SPLIT+SPLIT", help="also compare these "
                                                   "splits as one (repeatable): \"levels 1-3=test+family\"")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="also write the markdown here")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the comparison as JSON here")] = None,
) -> None:
    """Arms of runs (one per seed) against a shared start: per split, each seed's gain, the mean gain with an
    interval over seeds and questions, arm vs arm paired by seed, the extra-operation share and a verdict.

    `spanlab compare --start RUN --arm NAME RUN [RUN ...] [--arm NAME RUN ...]` (docs/compare.md).
    """
    from spanlab.compare.command import arm_groups, run

    try:
        arms = arm_groups(ctx.meta["raw_args"])
        if list(arms) != arm or len(ctx.args) != sum(len(runs) for runs in arms.values()):
            raise ConfigError(f"unexpected arguments {' '.join(ctx.args)}: give runs after --arm NAME")
        text = run(start, arms, start_phase=start_phase, reference=reference, out=out, json_path=json_path,
                   pools=pool or (), splits=[s for s in splits.split(",") if s] if splits else None)
    except SpanlabError as exc:
        _fail(exc)
        return
    sys.stdout.write(text)


@app.command()
def plot(
    db: DbOption = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="PNG file to write")] = Path("reward.png"),
    run_id: Annotated[str | None, typer.Option("--run", help="run id (default: the latest run)")] = None,
) -> None:
    """Write a PNG of a training run's reward curve and held-out accuracy, read from the store."""
    from spanlab.jobs.plot import plot_run
    from spanlab.store import SpanStore

    try:
        with SpanStore(sql_text.resolve_db(db)) as store:
            Console().print(f"wrote {plot_run(store, out, run_id)}")
    except SpanlabError as exc:
        _fail(exc)


@app.command()
def ui(
    db: DbOption = None,
    host: Annotated[str, typer.Option(help="interface to bind (the UI has no login: keep 127.0.0.1)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8600,
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="tokenizer folder for token text (default: the default model)")
    ] = None,
    allow_host: Annotated[
        list[str] | None, typer.Option("--allow-host", help="another Host name to answer (a DNS name of this machine)")
    ] = None,
) -> None:
    """Serve a local web page over the store (read-only): rollouts, calls, token view, training curves, SQL box."""
    from spanlab.ui import serve_ui

    try:
        serve_ui(sql_text.resolve_db(db), host=host, port=port, tokenizer_dir=tokenizer, extra_hosts=allow_host or ())
    except SpanlabError as exc:
        _fail(exc)


if __name__ == "__main__":
    app()
