"""Issue 65, items 3, 4 and 8: ``spanlab train --check`` refuses, in one line each and before anything starts, the
YAML that crashed or stalled it (non-scalar keys, a 5,000-digit integer, a 2 KB string aliased 20,000 times, merge
keys) and the configs that passed but failed later or did harm (temperature -1, a ``db`` that is no span store,
an empty model folder, ``/etc/passwd`` as a chat template); it masks ``engine.extra_env``, says "did you mean" for
a misspelt key, and never prints pydantic's "Value error," or "(top level)". A seeded fuzz run mixes these.

The real CLI in-process (stderr is not a terminal there: a long error must still be one line).
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.config import MAX_ALIAS_BYTES, load_yaml
from spanlab.errors import ConfigError
from spanlab.store import SpanStore

BASE = "algorithm: grpo\nagent: {name: calc, kwargs: {max_tokens: 32}}\ndataset: {name: calc, levels: [1]}\n"
TEMPLATE = Path(__file__).resolve().parents[2] / "spanlab" / "engine" / "templates" / "chatml_tools.jinja"


def _check(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    db = "" if "\ndb:" in "\n" + text else f"db: {tmp_path}/run.duckdb\n"
    path.write_text(text + db + f"out_dir: {tmp_path}/runs\n")
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    return result.exit_code, result.output


def _over_base(text: str) -> str:
    """``BASE`` less the sections ``text`` gives, then ``text`` (a section twice is a duplicate key)."""
    given = {line.split(":", 1)[0] for line in text.splitlines() if line and not line.startswith((" ", "?", ":"))}
    return "".join(line + "\n" for line in BASE.splitlines() if line.split(":", 1)[0] not in given) + text


def _one_line_error(code: int, output: str) -> str:
    assert code == 2 and "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Value error," not in output and "(top level)" not in output, output
    return lines[0]


def _files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "empty-model").mkdir()
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text("{}")
    (tmp_path / "text.db").write_text("hello, not a database\n")
    (tmp_path / "empty.db").write_bytes(b"")
    conn = duckdb.connect(str(tmp_path / "other.duckdb"))
    conn.execute("CREATE TABLE orders (id INTEGER)")
    conn.close()
    (tmp_path / "broken.jinja").write_text("{% for message in messages %}{{ message.content }")
    return {p.name: p for p in tmp_path.iterdir()}


BAD = {
    # item 3: YAML that crashed or stalled --check
    "list as a key": ("? [a, b]\n: 1\n", r"a key that is a list .*\(line 4\)"),
    "mapping as a key": ("? {a: 1}\n: 1\n", r"a key that is a mapping"),
    "5,000-digit integer": ("grpo: {steps: " + "9" * 5000 + "}\n", r"an integer of 5,000 characters"),
    "merge key": ("base: &b {seed: 1}\ndataset: {<<: *b, name: calc}\n", r"a YAML merge key \(`<<:`\)"),
    "an impossible date": ("run_name: 2001-13-45\n", r"a value YAML cannot read: month must be in 1\.\.12"),
    # item 4: configs that passed --check and failed later or did harm
    "temperature -1": ("agent: {name: calc, kwargs: {temperature: -1}}\n",
                       r"agent\.kwargs: temperature: -1 is out of range"),
    "top_p 0": ("agent: {name: calc, kwargs: {top_p: 0}}\n", r"agent\.kwargs: top_p: 0 is out of range"),
    "top_p above 1": ("agent: {name: calc, kwargs: {top_p: 1.5}}\n", r"top_p: 1\.5 is out of range"),
    "presence_penalty 3": ("agent: {name: calc, kwargs: {presence_penalty: 3}}\n", r"presence_penalty: 3 is out"),
    "temperature as text": ("agent: {name: calc, kwargs: {temperature: hot}}\n", r"temperature: expects a number"),
    "max_tokens 0": ("agent: {name: calc, kwargs: {max_tokens: 0}}\n", r"max_tokens: expects an integer >= 1"),
    "top_k -2": ("agent: {name: calc, kwargs: {top_k: -2}}\n", r"top_k: expects -1 or 0"),
    "db a text file": ("db: {text.db}\n", r"db: .*text\.db exists and is not a DuckDB file"),
    "db an empty file": ("db: {empty.db}\n", r"db: .*empty\.db exists and is empty"),
    "db another database": ("db: {other.duckdb}\n", r"db: .*other\.duckdb is a DuckDB database but not a span "
                                                    r"store \(its tables: orders\)"),
    "empty model folder": ("engine: {model: {empty-model}}\n",
                           r"engine\.model: folder .*empty-model' holds no model: no config\.json and weights"),
    "model folder without weights": ("engine: {model: {config-only}}\n",
                                     r"engine\.model: .*config-only' holds no model: no weights"),
    "/etc/passwd as template": ("token_source: retokenized\nretokenize_template: /etc/passwd\n",
                                r"retokenize_template: '/etc/passwd' is not a chat template: it never reads "
                                r"`messages`"),
    "template that is no Jinja": ("token_source: retokenized\nretokenize_template: {broken.jinja}\n",
                                  r"retokenize_template: .*broken\.jinja' is not a Jinja template"),
    # item 8: wording
    "misspelt section": ("datset: {seed: 1}\n", r"datset: unknown key; did you mean dataset\?"),
    "misspelt key": ("grpo: {stpes: 2}\n", r"grpo\.stpes: unknown key; did you mean steps\?"),
    "misspelt nested key": ("grpo: {credit: {mdoe: per_turn}}\n", r"grpo\.credit\.mdoe: unknown key; did you mean "
                                                                  r"mode\?"),
    "a whole-config problem": ("engine_url: http://127.0.0.1:1\nengine: {replicas: 2}\n",
                               r"is invalid: engine\.replicas: 2 engines to start, but engine_url names running "),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_each_bad_config_is_one_line_before_anything_starts(tmp_path: Path, case: str) -> None:
    text, message = BAD[case]
    files = _files(tmp_path)
    before = {name: p.read_bytes() for name, p in files.items() if p.is_file()}
    for name, path in files.items():
        text = text.replace("{" + name + "}", str(path))
    line = _one_line_error(*_check(tmp_path, _over_base(text)))
    assert re.search(message, line), line
    assert {name: p.read_bytes() for name, p in files.items() if p.is_file()} == before  # nothing written
    assert not (tmp_path / "runs").exists() and not (tmp_path / "run.duckdb").exists()


def test_a_long_string_aliased_20000_times_is_refused_fast(tmp_path: Path) -> None:
    """82 KB that read as 41 MB: --check ran 72 s and printed it all. Aliases are now measured in bytes."""
    text = "prompt: &p " + "x" * 2000 + "\nagent: {name: calc, kwargs: {max_tokens: 32, stops: [" + \
        ", ".join(["*p"] * 20_000) + "]}}\n"
    assert 80_000 < len(text) < 130_000
    cpu = time.process_time()
    line = _one_line_error(*_check(tmp_path, text))
    assert time.process_time() - cpu < 10
    assert f"more than {MAX_ALIAS_BYTES:,} bytes" in line and "40,000,000 bytes" in line, line


def test_aliases_of_a_prompt_a_few_times_are_still_a_config(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("p: &p " + "x" * 2000 + "\n" + "".join(f"k{i}: *p\n" for i in range(100)))
    assert len(load_yaml(path)["k99"]) == 2000
    path.write_text("p: &p " + "x" * 20_000 + "\n" + "".join(f"k{i}: *p\n" for i in range(100)))
    with pytest.raises(ConfigError, match=r"aliases that expand it by 2,000,000 bytes"):
        load_yaml(path)


def test_what_must_stay_accepted_still_is(tmp_path: Path) -> None:
    """A hub name, an existing span store (left as it was), a real chat template, in-range sampling settings."""
    db = tmp_path / "store.duckdb"
    with SpanStore(db) as store:
        store.enqueue_one({"q": 1})
    before = db.read_bytes()
    code, output = _check(tmp_path, BASE.replace("max_tokens: 32", "max_tokens: 32, temperature: 0.7")
                          + f"db: {db}\nengine: {{model: Qwen/Qwen3-1.7B}}\ntoken_source: retokenized\n"
                          f"retokenize_template: {TEMPLATE}\n")
    assert code == 0 and "nothing started" in output, output
    assert db.read_bytes() == before


def test_extra_env_values_are_masked_like_the_token(tmp_path: Path) -> None:
    code, output = _check(tmp_path, BASE + "engine: {extra_env: {HF_TOKEN: hf_s3cret, VLLM_X: pl41n_v4lue}}\n"
                                           "gateway: {token: tok3n}\n")
    assert code == 0, output
    assert "hf_s3cret" not in output and "pl41n_v4lue" not in output and "tok3n" not in output, output
    assert "HF_TOKEN: '**********'" in output and "VLLM_X: '**********'" in output, output


# The fuzz run's pieces: each a fragment that alone is valid or refused, put together at random.
FRAGMENTS = [
    "? [a, b]\n: 1\n", "x: &a {seed: 1}\ndataset: {<<: *a}\n", "grpo: {steps: " + "7" * 4400 + "}\n",
    "agent: {name: calc, kwargs: {temperature: -1}}\n", "agent: {name: calc, kwargs: {top_p: 2}}\n",
    "datset: {seed: 2}\n", "grpo: {lr: .nan}\n", "grpo: {steps: 1e400}\n", "engine: {model: ''}\n",
    "run_name: [a]\n", "eval: {tasks: yes}\n", "dataset: {levels: {1: 2}}\n", "when: 2001-02-30\n",
    "token_source: retokenized\nretokenize_template: /etc/hostname\n", "engine: {extra_env: {A: [1]}}\n",
    "grpo: {credit: {mode: per_turn, discount: -1}}\n", "rollouts: {concurrency: 0}\n", "? !!binary aGk=\n: 1\n",
    "s: &s " + "y" * 3000 + "\nt: [" + ", ".join(["*s"] * 400) + "]\n", "db: /dev/null\n", "- a\n- b\n",
    "grpo: {steps: 2}\n", "eval: {tasks: 3}\n", "rollouts: {temperature: 0.5}\n", "agent: {name: calc}\n",
]


@pytest.mark.parametrize("seed", range(12))
def test_fuzz_check_gives_one_line_or_ok_never_a_traceback(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    pieces = rng.sample(FRAGMENTS, k=rng.randint(1, 3))
    seen_keys: set[str] = set()
    text = ""
    for piece in pieces:  # one top-level key once (a second would be "duplicate key", a refusal too dull to fuzz)
        key = piece.split(":", 1)[0]
        if key not in seen_keys:
            seen_keys.add(key)
            text += piece
    code, output = _check(tmp_path, text)
    assert "Traceback" not in output, (pieces, output)
    if code != 0:  # one line, or (several keys wrong at once) the list of them, one line each
        first, *more = output.strip().splitlines()
        assert code == 2 and first.startswith("error: "), (pieces, output)
        assert all(line.startswith("  ") for line in more) and (not more or first.endswith("is invalid:")), output
        assert "Value error," not in output and "(top level)" not in output, output
    else:
        assert "nothing started" in output, (pieces, output)
