"""``spanlab train`` refuses bad input before anything starts: one clear error naming the key, no traceback.

Every case runs the real CLI in-process with ``--check`` (cheap: no engine, no torch for GRPO's checks).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config

BASE = "algorithm: grpo\nagent: {name: calc, kwargs: {max_tokens: 32}}\ndataset: {name: calc, levels: [1]}\n"


def _check(tmp_path: Path, text: str | bytes, *args: str) -> tuple[int, str]:
    path = tmp_path / "train.yaml"
    if isinstance(text, str):
        db = "" if "db:" in text else f"db: {tmp_path}/run.duckdb\n"
        text = (text + db + f"out_dir: {tmp_path}/runs\n").encode()
    path.write_bytes(text)
    result = CliRunner().invoke(app, ["train", str(path), "--check", *args])
    return result.exit_code, result.output


BAD = {
    "non-UTF-8": (b"algorithm: grpo\nrun_name: \xff\xfe\n", (), "not UTF-8"),
    "unwritable db": (BASE + "db: /proc/spanlab/run.duckdb\n", (), "cannot write /proc/spanlab/run.duckdb"),
    "engine_url": (BASE + "engine_url: not-a-url\n", (), "engine_url.*not an http"),
    "unknown level": ("agent: {name: calc}\ndataset: {name: calc, levels: [7]}\n", (), "dataset.*levels must be"),
    "huge steps": (BASE + "grpo: {steps: 1000000000000}\n", (), r"grpo\.steps"),
    "old loop section": (BASE + "loop: {steps: 3}\n", (), r"loop: was split up.*grpo\.steps"),
    "unknown agent": ("agent: {name: nope}\n", (), "agent 'nope' is not registered"),
    "unknown agent kwarg": ("agent: {name: calc, kwargs: {bogus: 1}}\n", (), "bad kwargs.*bogus"),
    "duplicate key": (BASE + "run_name: a\nrun_name: b\n", (), "duplicate key 'run_name'"),
    "empty train_levels": (BASE.replace("levels: [1]", "levels: [1], train_levels: []"), (),
                           r"dataset\.train_levels"),
    "infinite timeout": (BASE + "rollouts: {timeout_s: .inf}\n", (), r"rollouts\.timeout_s"),
    "run_name escapes out_dir": (BASE + "run_name: ../../..\n", (), r"run_name.*plain folder name"),
    "negative --steps": (BASE, ("--steps", "-1"), r"grpo\.steps"),
    "another algorithm's section": (BASE.replace("grpo", "sft") + "grpo: {lr: 0.1}\n", (),
                                    "grpo: a section for algorithm 'grpo', but this config runs 'sft'"),
    "unknown algorithm": ("algorithm: ppo\n", (), "unknown algorithm 'ppo'; known: apo, grpo, sft"),
    "moved sft key": ("algorithm: sft\nsft: {temperature: 1.0}\n", (), "sft.temperature: moved to rollouts"),
    "trainer for sft": (BASE.replace("grpo", "sft") + "trainer: {processes: 2}\n", (),
                        r"trainer\.processes: algorithm 'sft' trains in one process"),
    "unknown extra split": (BASE + "eval: {extra_splits: [nope]}\n", (),
                            r"eval\.extra_splits: task set 'calc': split must be one of"),
    "headline split twice": (BASE + "eval: {extra_splits: [test]}\n", (), r"eval: .*extra_splits: 'test' is"),
    "no deeper level": (BASE.replace("levels: [1]", "levels: [5]") + "eval: {extra_splits: [depth]}\n", (),
                        r"eval\.extra_splits: .*no depth split beyond level 5"),
    "unknown dataset kwarg": (BASE.replace("levels: [1]", "levels: [1], kwargs: {wording: x}"), (),
                              r"dataset\.kwargs: .*wording"),
    "negative max_staleness": (BASE + "loop: {mode: async, max_staleness: -1}\n", (),
                               r"loop\.max_staleness: Input should be greater than or equal to 0"),
    "too few groups in flight": (BASE + "grpo: {tasks_per_step: 4}\nloop: {mode: async, in_flight_groups: 3}\n",
                                 (), r"loop\.in_flight_groups: 3 is fewer than a step's groups"),
    "async settings in sync": (BASE + "loop: {max_staleness: 2}\n", (),
                               r"loop: .*max_staleness: only used with mode: async"),
    "async for sft": (BASE.replace("grpo", "sft") + "loop: {mode: async}\n", (),
                      r"loop\.mode: algorithm 'sft' has no async loop"),
    "bad phrasings": (BASE.replace("levels: [1]", "levels: [1], kwargs: {phrasings: some}"), (),
                      r"dataset: .*phrasings must be 'original' or 'all'"),
    # issue 42, item 7: each was a traceback, or accepted although wrong
    "negative max_turns": (BASE.replace("max_tokens: 32", "max_turns: -3"), (), r"agent\.kwargs: .*max_turns"),
    "infinite lr": (BASE + "grpo: {lr: .inf}\n", (), r"grpo\.lr: inf is not a finite number"),
    "huge micro-batch": (BASE + "grpo: {micro_batch_tokens: 1.0e+20}\n", (),
                         r"grpo\.micro_batch_tokens: 1e\+20 is out"),
    "huge int": (BASE + "grpo: {micro_batch_tokens: 100000000000000000000}\n", (), r"grpo\.micro_batch_tokens"),
    "a billion epochs": (BASE + "warm_start: {epochs: 1000000000}\n", (), r"warm_start\.epochs"),
    "db is a folder": (BASE + "db: /etc\n", (), r"db: .*'/etc' is a folder"),
    "empty db": (BASE + "db: ''\n", (), r"db: .*is empty"),
    "empty engine.model": (BASE + "engine: {model: ''}\n", (), r"engine\.model: .*model is empty"),
    "missing model folder": (BASE + "engine: {model: /no/such/model}\n", (), r"engine\.model: .*no such folder"),
    # issue 45: per-turn credit
    "unknown credit mode": (BASE + "grpo: {credit: {mode: per_step}}\n", (),
                            r"grpo\.credit\.mode: Input should be 'broadcast' or 'per_turn'"),
    "discount without per_turn": (BASE + "grpo: {credit: {discount: 0.9}}\n", (),
                                  r"grpo\.credit: .*discount 0\.9 has no effect with mode 'broadcast'"),
    "discount above 1": (BASE + "grpo: {credit: {mode: per_turn, discount: 1.5}}\n", (),
                         r"grpo\.credit\.discount: Input should be less than or equal to 1"),
    "unknown normalization": (BASE + "grpo: {credit: {mode: per_turn, normalize: role}}\n", (),
                              r"grpo\.credit\.normalize: Input should be 'group' or 'group_role'"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_clear_error_before_anything_starts(tmp_path: Path, case: str) -> None:
    text, args, message = BAD[case]
    code, output = _check(tmp_path, text, *args)
    assert code == 2, output
    assert "Traceback" not in output and output.startswith("error:"), output
    assert re.search(message, " ".join(output.split())), output


def test_check_prints_the_resolved_settings_of_the_chosen_algorithm_only(tmp_path: Path) -> None:
    code, output = _check(tmp_path, BASE + "grpo: {steps: 2}\n", "--steps", "3")
    assert not (tmp_path / "runs").exists()  # checked by writing there, then removed: --check leaves no trace
    assert code == 0, output
    assert "grpo:\n  lr: 1.0e-05" in output and "  steps: 3\n" in output
    assert "sft:" not in output and "apo:" not in output
    assert "nothing started" in output


def test_lora_serving_is_turned_on_for_an_adapter_policy() -> None:
    config = parse_train_config({"grpo": {"lora": {"rank": 4}}})
    assert config.engine.enable_lora and config.engine.dev_routes and config.engine.max_lora_rank == 8
    # An adapter above the engine's default rank raises it: vLLM refused rank 32 at the first push (max 8).
    assert parse_train_config({"grpo": {"lora": {"rank": 32}}}).engine.max_lora_rank == 32
    assert parse_train_config({"sft": {"lora": {"rank": 16}, "save": "adapter"}, "algorithm": "sft"}
                              ).engine.max_lora_rank == 16
    with pytest.raises(ConfigError, match=r"grpo: .*group_size must be >= 2"):
        parse_train_config({"grpo": {"group_size": 1}})


def test_engines_beside_a_gpu_trainer_leave_it_most_of_the_gpu() -> None:
    def share(engine: dict, **more: object) -> float | None:
        config = parse_train_config({"engine": engine, "trainer": {"device": "gpu"}, **more})
        return config.engine.gpu_memory_utilization

    assert share({"device": "gpu"}) == 0.3  # vLLM's own default would be 0.9
    assert share({"device": "gpu", "replicas": 2}) == 0.15  # the replicas split it
    assert share({"device": "gpu", "gpu_memory_utilization": 0.6}) == 0.6  # said in the config: kept
    assert share({"device": "gpu"}, engine_url="http://10.0.0.5:8000") is None  # not started by the job
    assert parse_train_config({"engine": {"device": "gpu"}}).engine.gpu_memory_utilization is None  # CPU trainer


def test_an_async_run_cannot_resume_and_its_defaults_follow_the_step() -> None:
    from spanlab.jobs.checkpoints import check_resumable
    from spanlab.jobs.job import build_algorithm

    config = parse_train_config({"algorithm": "grpo", "grpo": {"tasks_per_step": 3}, "loop": {"mode": "async"}})
    assert (config.loop.staleness, config.loop.groups_in_flight(3)) == (1, 6)
    with pytest.raises(ConfigError, match=r"--resume: a loop\.mode: async run keeps groups in flight"):
        check_resumable(build_algorithm(config), config)


def test_dataset_train_tasks_sets_the_train_pool_rl_draws_from() -> None:
    """Without a warm start a run generates twice its own draws; train_tasks gives it the pool a warm start had."""
    from spanlab.jobs.job import check_job

    data = {"algorithm": "grpo", "grpo": {"steps": 1, "tasks_per_step": 8},
            "dataset": {"name": "calc", "levels": [1, 2, 3], "train_levels": [3]}}
    _, _, small = check_job(parse_train_config(data))
    _, _, large = check_job(parse_train_config({**data, "dataset": {**data["dataset"], "train_tasks": 128}}))
    assert (len(small["train"]), len(large["train"])) == (16, 128)
    assert len(small["rl"]) < 8 <= len(large["rl"]) and {t["level"] for t in large["rl"]} == {3}
    assert large["train"][:16] == small["train"]  # a longer list of the same tasks, so runs stay comparable


BOMB = "a: &a [" + ", ".join(["lol"] * 9) + "]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))  # 9^9 values


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    start = time.monotonic()
    code, output = _check(tmp_path, BASE + BOMB)
    assert code == 2 and "aliases are expanded" in output, output
    assert time.monotonic() - start < 30


def test_a_huge_config_gives_a_short_error(tmp_path: Path) -> None:
    leaves = ", ".join(f"k{i}: 1" for i in range(100_000))
    code, output = _check(tmp_path, BASE + f"grpo: {{{leaves}}}\n")
    assert code == 2 and "Traceback" not in output, output[:500]
    assert len(output.splitlines()) < 30 and "more" in output, output[:2000]


def test_a_config_path_that_is_a_folder_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", str(tmp_path), "--check"])
    assert result.exit_code == 2 and "is a folder" in result.output, result.output


# A module that fails as it is imported, in each way a plugin or an agent module can.
BROKEN = {"raises": "raise RuntimeError('boom at import')\n", "syntax": "def f(:\n",
          "exits": "import sys\nsys.exit(3)\n"}


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_plugin_that_fails_to_import_is_one_config_error_naming_it(tmp_path: Path, how: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / f"broken_{how}-0.1.dist-info").mkdir(parents=True)
    (site / f"broken_{how}-0.1.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: broken_{how}\n"
                                                                     "Version: 0.1\n")
    (site / f"broken_{how}-0.1.dist-info" / "entry_points.txt").write_text(
        f"[spanlab.algorithms]\nbroken_{how} = broken_{how}_mod:Algo\n")
    (site / f"broken_{how}_mod.py").write_text(BROKEN[how])
    monkeypatch.syspath_prepend(str(site))
    code, output = _check(tmp_path, f"algorithm: broken_{how}\n")
    assert code == 2 and "Traceback" not in output, output
    assert re.search(rf"algorithm: plugin 'broken_{how}' .*failed to load", " ".join(output.split())), output


@pytest.mark.parametrize("how", list(BROKEN))
def test_an_agent_module_that_fails_to_import_is_one_config_error(tmp_path: Path, how: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"agent_{how}_mod.py").write_text(BROKEN[how])
    monkeypatch.syspath_prepend(str(tmp_path))
    code, output = _check(tmp_path, BASE.replace("name: calc, kwargs: {max_tokens: 32}", f"name: 'agent_{how}_mod:A'"))
    assert code == 2 and "Traceback" not in output, output
    assert re.search(rf"agent: cannot load agent 'agent_{how}_mod:A'", " ".join(output.split())), output
