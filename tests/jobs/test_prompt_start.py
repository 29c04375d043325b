"""``prompt: FILE.poml`` in a train config: checked before anything starts, then the prompt every unpinned rollout gets.

The rollouts of GRPO, SFT and the held-out evaluation pin no prompt version, so the worker hands the agent the
latest version of each resource (``resolve_resources``); the file must be that latest version, also in a store
where another text is newer than an earlier copy of it. The calc agent then renders it into its messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spanlab.agents.calc.agent import default_template, prompt_input
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import check_job
from spanlab.jobs.prompt import check_prompt, store_prompt
from spanlab.prompts import DEFAULT_RENDERER
from spanlab.runner.worker import resolve_resources
from spanlab.store import SpanStore

WINNER = ("<poml>\n<p>Use the calculator, then answer with the number.</p>\n<human-msg>{{ question }}</human-msg>\n"
          "</poml>\n")


def _config(tmp_path: Path, **extra: object):
    data = {"algorithm": "grpo", "db": str(tmp_path / "run.duckdb"), "out_dir": str(tmp_path / "runs"),
            "agent": {"name": "calc"}, "dataset": {"name": "calc", "levels": [1]}, **extra}
    return parse_train_config(data)


def test_a_bad_prompt_is_one_clear_error_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"prompt .*nope.poml' is not a file"):
        _config(tmp_path, prompt=str(tmp_path / "nope.poml"))
    no_question = tmp_path / "bad.poml"
    no_question.write_text("<poml><p>Answer.</p></poml>")
    with pytest.raises(ConfigError, match=r"prompt: .*bad.poml fails the prompt checks: .*question"):
        check_job(_config(tmp_path, prompt=str(no_question)))
    good = tmp_path / "good.poml"
    good.write_text(WINNER)
    apo = parse_train_config({"algorithm": "apo", "prompt": str(good), "agent": {"name": "calc"},
                              "db": str(tmp_path / "run.duckdb")})
    with pytest.raises(ConfigError, match=r"APO starts from apo.prompt"):
        check_prompt(apo)
    with pytest.raises(ConfigError, match=r"eval.base: APO's paired difference needs"):
        check_job(parse_train_config({"algorithm": "apo", "eval": {"base": False}, "agent": {"name": "calc"}}))
    assert check_prompt(_config(tmp_path, prompt=str(good))) == WINNER


def test_the_file_becomes_the_prompt_every_unpinned_rollout_renders(tmp_path: Path) -> None:
    with SpanStore(tmp_path / "run.duckdb") as store:
        store.add_resource("prompt", {"template": WINNER}, kind="prompt_template")  # an earlier copy of the text
        store.add_resource("prompt", {"template": default_template()}, kind="prompt_template")  # newer, different
        version = store_prompt(store, WINNER, file="winner.poml")
        assert version == 3 and store_prompt(store, WINNER, file="winner.poml") == 3  # once only, e.g. on --resume
        resources = resolve_resources(store, None)  # what the worker gives an agent when the rollout pins nothing
    assert resources["prompt"].version == 3
    messages = DEFAULT_RENDERER.render(str(resources["prompt"].payload["template"]), {"question": "What is 2 + 3?"})
    instructions, turns = prompt_input(messages)
    assert instructions == "Use the calculator, then answer with the number."
    assert turns == [{"role": "user", "content": "What is 2 + 3?"}]
