"""What ``spanlab train --check`` reads of the files a config names: that each is the kind of file it must be.

A path that exists is not yet the right file: ``db`` may name someone's other database (the run would write its
tables into it), ``engine.model`` an empty folder (vLLM fails a minute into its start), ``retokenize_template``
any text file (``/etc/passwd`` rendered as a chat template). Each is refused in one line naming the key, before
anything starts, and nothing here writes to the file it reads.
"""

from __future__ import annotations

from pathlib import Path

from spanlab.errors import ConfigError, one_line

DUCKDB_MAGIC = b"DUCK"  # a DuckDB file's header: an 8-byte checksum, then these 4 bytes
MAX_TEMPLATE_BYTES = 1 << 20  # chat templates are a few KB; the largest known ones are under 100 KB
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")


def check_store_file(db: Path) -> None:
    """``db``, if it exists, is a DuckDB file that holds a span store or nothing yet (read-only, so it is left as it
    was). A file a process holds (this one included) is left to the run's own open, which names the holder."""
    import duckdb

    from spanlab.store.schema import schema_version_problem

    if not db.is_file():
        return
    try:
        with db.open("rb") as fh:
            header = fh.read(12)
    except OSError as exc:
        raise ConfigError(f"db: cannot read {db}: {exc.strerror or exc}") from exc
    if not header:
        raise ConfigError(f"db: {db} exists and is empty, which DuckDB refuses to open; remove it or give a new "
                          "path")
    if header[8:12] != DUCKDB_MAGIC:
        raise ConfigError(f"db: {db} exists and is not a DuckDB file (a span store is one); give a new path or "
                          "an existing span store")
    try:
        conn = duckdb.connect(str(db), read_only=True)
    except duckdb.Error as exc:
        # held: read-write by another process (a lock), or by this one (a connection of another configuration)
        if isinstance(exc, duckdb.ConnectionException) or "lock" in str(exc).lower():
            return
        raise ConfigError(f"db: {db} cannot be opened as a DuckDB file: {one_line(exc, 200)}") from exc
    try:
        tables = {name for (name,) in conn.execute("SELECT table_name FROM information_schema.tables "
                                                   "WHERE table_schema = 'main'").fetchall()}
        if not tables:
            return
        if "spanlab_meta" not in tables:
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise ConfigError(f"db: {db} is a DuckDB database but not a span store (its tables: {shown}); give "
                              "a new path or an existing span store")
        version = conn.execute("SELECT value FROM spanlab_meta WHERE key = 'schema_version'").fetchall()
    except duckdb.Error as exc:
        raise ConfigError(f"db: {db} cannot be read as a span store: {one_line(exc, 200)}") from exc
    finally:
        conn.close()
    if problem := schema_version_problem(str(db), version[0][0] if version else None):
        raise ConfigError(f"db: {problem}")


def model_folder_problem(model: str) -> str | None:
    """Why ``engine.model``, when it names a local folder, holds no model vLLM can load (a Hugging Face folder:
    ``config.json`` beside weights; or a GGUF file); None when it does, or when it names no folder (a hub name
    such as ``Qwen/Qwen3-1.7B`` or spanlab's default model)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    try:
        if any(folder.glob("*.gguf")):
            return None
        has_config = (folder / "config.json").is_file()
        has_weights = any(any(folder.glob(pattern)) for pattern in _WEIGHTS)
    except OSError as exc:
        return f"cannot read folder {model!r}: {exc.strerror or exc}"
    if has_config and has_weights:
        return None
    missing = " and ".join(what for what, have in (("config.json", has_config),
                                                   ("weights (*.safetensors, *.bin)", has_weights)) if not have)
    return f"folder {model!r} holds no model: no {missing}, and no *.gguf file"


def chat_template_problem(path: Path) -> str | None:
    """Why ``path`` is not a chat template: not readable UTF-8 text, not Jinja, or a template that never reads
    ``messages`` (the conversation it is there to render); None when it is one."""
    import jinja2
    import jinja2.ext
    import jinja2.meta

    from spanlab.tito.jinja import SANDBOXES, GenerationTag

    try:
        if path.stat().st_size > MAX_TEMPLATE_BYTES:
            return f"{str(path)!r} is {path.stat().st_size:,} bytes, far more than a chat template"
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return f"{str(path)!r} is not UTF-8 text, so not a chat template"
    except OSError as exc:
        return f"cannot read {str(path)!r}: {exc.strerror or exc}"
    env = SANDBOXES["immutable"](extensions=[jinja2.ext.loopcontrols, GenerationTag])
    try:
        names = jinja2.meta.find_undeclared_variables(env.parse(text))
    except jinja2.TemplateSyntaxError as exc:
        return f"{str(path)!r} is not a Jinja template: {one_line(exc, 160)} (line {exc.lineno})"
    if "messages" not in names:
        return (f"{str(path)!r} is not a chat template: it never reads `messages` (a chat template renders "
                "{% for message in messages %} ...)")
    return None
