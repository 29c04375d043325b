"""``grpo.replay``: the groups the policy solved in every sample (GRPO drops them: no variance) come back as an NLL
term. Tiny random Llama, real GRPO steps, plain SGD: the term adds exactly ``coef`` x the mean token NLL gradient of
one rollout per all-solved group, nothing when none is solved, only on the configured levels (read from a real
store), beside the demonstration term as a sum; bad configs are one-line errors."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from spanlab.adapters.conversation import sft_sample
from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.config import DemonstrationTerm, GRPOConfig, ReplayTerm
from spanlab.algos.grpo.loop import _replay_draws
from spanlab.algos.grpo.nll_terms import ReplayDraw, replayed_rows
from spanlab.algos.grpo.update import grpo_step
from spanlab.cli import app
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import build_algorithm
from spanlab.store import SpanStore
from spanlab.training.logprobs import token_logprobs

LR = 0.5


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Equal runs sum in the same order: the comparisons below hold to float rounding."""


def _tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, head_dim=16))


def _sample(rollout: str, group: str, reward: float, seed: int, n: int = 10, prompt: int = 5) -> Sample:
    rng = np.random.default_rng(seed)
    mask = np.array([0] * prompt + [1] * (n - prompt), np.uint8)
    return Sample(rollout, group, rng.integers(0, 40, n).astype(np.int32), mask, np.full(n, -3.0, np.float32),
                  reward)


def _mixed_group() -> list[Sample]:
    """A group with reward variance: what GRPO trains on, so the step is not skipped."""
    return [_sample(f"g{i}", "g", r, seed=100 + i) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])]


def _failed_group() -> list[Sample]:
    return [_sample(f"f{i}", "f", 0.0, seed=200 + i) for i in range(2)]


def _solved_groups() -> list[Sample]:
    """Two all-solved groups; a converged policy's rollouts, token for token the same within a group, so whichever
    rollout the draw takes, the replayed rows are known. ``s2`` holds three copies of a longer answer: a term that
    took every sample instead of one per group would weigh it more (and report 5 rows)."""
    s1 = [_sample(f"s1{c}", "s1", 1.0, seed=300) for c in "ab"]
    s2 = [_sample(f"s2{c}", "s2", 1.0, seed=301, n=14, prompt=4) for c in "abc"]
    return s1 + s2


def _step(config: GRPOConfig, samples: list[Sample], **kw: object) -> tuple[torch.nn.Module, dict[str, float]]:
    model = _tiny_model()
    metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=LR), samples, config, pad_id=0, **kw)
    return model, metrics


def _nll_grads(rows: list[Sample]) -> tuple[float, list[torch.Tensor]]:
    """The rows' mean token NLL (over all their trained tokens together) and its gradient, at the start weights."""
    model = _tiny_model()
    lp_sum, tokens = torch.zeros(()), 0.0
    for r in rows:
        ids = torch.as_tensor(r.input_ids.astype(np.int64))[None]
        mask = torch.as_tensor(r.loss_mask.astype(np.float32))[None]
        lp = token_logprobs(model, ids, torch.ones_like(ids), positions_mask=mask > 0)
        lp_sum, tokens = lp_sum + (lp * mask).sum(), tokens + float(mask.sum())
    nll = -lp_sum / tokens
    nll.backward()
    return float(nll.detach()), [p.grad.clone() for p in model.parameters()]


def _plain() -> GRPOConfig:
    return GRPOConfig(tis_cap=None, max_grad_norm=1e9)


def test_replay_adds_coef_times_the_mean_nll_of_one_rollout_per_all_solved_group() -> None:
    coef = 0.3
    samples = _mixed_group() + _failed_group() + _solved_groups()
    rl_only, _ = _step(_plain(), samples)
    mixed, metrics = _step(_plain().model_copy(update={"replay": ReplayTerm(coef=coef)}), samples)

    solved = _solved_groups()
    nll, grads = _nll_grads([solved[0], solved[2]])  # one rollout of s1, one of s2
    assert metrics["replay_rows"] == 2.0 and metrics["replay_groups"] == 2.0
    assert metrics["replay_groups_solved"] == 2.0
    assert metrics["replay_tokens"] == 5.0 + 10.0
    assert metrics["replay_nll"] == pytest.approx(nll, rel=1e-4)
    assert metrics["n_groups_with_signal"] == 1.0  # GRPO itself still trains the mixed group only
    for p_rl, p_mixed, g in zip(rl_only.parameters(), mixed.parameters(), grads, strict=True):
        torch.testing.assert_close(p_mixed, p_rl - LR * coef * g, rtol=1e-4, atol=1e-6)


def test_no_all_solved_group_means_no_rows_and_the_plain_update() -> None:
    samples = _mixed_group() + _failed_group()
    rl_only, _ = _step(_plain(), samples)
    mixed, metrics = _step(_plain().model_copy(update={"replay": ReplayTerm(coef=0.3)}), samples)
    assert metrics["replay_rows"] == 0.0 and metrics["replay_groups_solved"] == 0.0
    assert math.isnan(metrics["replay_nll"])
    for p_rl, p_mixed in zip(rl_only.parameters(), mixed.parameters(), strict=True):
        assert torch.equal(p_rl, p_mixed)


def test_without_the_config_a_draw_changes_nothing_and_reports_nothing() -> None:
    samples = _mixed_group() + _solved_groups()
    rl_only, _ = _step(_plain(), samples)
    same, metrics = _step(_plain(), samples, replay=ReplayDraw("x"))
    assert not any(k.startswith("replay_") for k in metrics)
    for p_rl, p_same in zip(rl_only.parameters(), same.parameters(), strict=True):
        assert torch.equal(p_rl, p_same)


def test_replay_beside_the_demonstration_term_adds_both_gradients() -> None:
    rng = np.random.default_rng(5)
    demo_mask = np.array([0] * 4 + [1] * 8, np.uint8)
    demos = [sft_sample(rng.integers(0, 40, 12).astype(np.int32), demo_mask) for _ in range(2)]
    samples = _mixed_group() + _solved_groups()
    both = _plain().model_copy(update={"demonstrations": DemonstrationTerm(coef=0.7), "replay": ReplayTerm(coef=0.3)})
    rl_only, _ = _step(_plain(), samples)
    mixed, metrics = _step(both, samples, demos=demos)
    demo_nll, demo_grads = _nll_grads(demos)
    replay_nll, replay_grads = _nll_grads([_solved_groups()[0], _solved_groups()[2]])
    assert metrics["demo_nll"] == pytest.approx(demo_nll, rel=1e-4)
    assert metrics["replay_nll"] == pytest.approx(replay_nll, rel=1e-4)
    assert metrics["demo_samples"] == 2.0 and metrics["replay_rows"] == 2.0
    for p_rl, p_mixed, gd, gr in zip(rl_only.parameters(), mixed.parameters(), demo_grads, replay_grads, strict=True):
        torch.testing.assert_close(p_mixed, p_rl - LR * (0.7 * gd + 0.3 * gr), rtol=1e-4, atol=1e-6)


def test_the_rows_are_one_whole_rollout_per_solved_group_drawn_by_the_seed() -> None:
    seeds = iter(range(1000))

    def rollout(rid: str, group: str, reward: float, calls: int = 2) -> list[Sample]:
        return [_sample(rid, group, reward, seed=next(seeds)) for _ in range(calls)]

    samples = [s for g in "abcd" for r in range(3) for s in rollout(f"{g}{r}", g, 1.0)]
    samples += rollout("p0", "p", 1.0) + rollout("p1", "p", 0.0)  # partly solved: GRPO's
    samples += rollout("v0", "v", 1.0) + rollout("v1", "v", 1.5)  # all above 1.0 but varying: GRPO's too
    signal = {"p", "v"}
    every = replayed_rows(samples, signal, ReplayTerm(coef=1.0), ReplayDraw("s0"))
    assert (every.groups_solved, every.groups, len(every.rows)) == (4, 4, 8)
    by_group = {s.group_id: {r.rollout_id for r in every.rows if r.group_id == s.group_id} for s in every.rows}
    assert sorted(by_group) == list("abcd") and all(len(r) == 1 for r in by_group.values())  # one rollout each
    capped = replayed_rows(samples, signal, ReplayTerm(coef=1.0, per_step=2), ReplayDraw("s0"))
    assert (capped.groups_solved, capped.groups, len(capped.rows)) == (4, 2, 4)
    again = replayed_rows(samples, signal, ReplayTerm(coef=1.0, per_step=2), ReplayDraw("s0"))
    assert [r.rollout_id for r in again.rows] == [r.rollout_id for r in capped.rows]  # a seeded choice
    draws = {tuple(r.rollout_id for r in replayed_rows(samples, signal, ReplayTerm(coef=1.0, per_step=2),
                                                        ReplayDraw(f"s{k}")).rows) for k in range(20)}
    assert len(draws) > 1  # ... that the seed changes
    some = replayed_rows(samples, signal, ReplayTerm(coef=1.0), ReplayDraw("s0", frozenset({"a0", "a1", "a2", "c1"})))
    assert some.groups_solved == 1 and {r.group_id for r in some.rows} == {"a"}  # "c" has rollouts of other levels
    strict = replayed_rows(samples, set(), ReplayTerm(coef=1.0, solved_reward=1.5), ReplayDraw("s0"))
    assert strict.groups_solved == 0 and strict.rows == []


def test_levels_keep_the_groups_of_tasks_of_those_levels_as_the_store_holds_them() -> None:
    with SpanStore(":memory:") as store:
        tasks = [{"task_id": "t1", "level": 1}, {"task_id": "t2", "level": 2}, {"task_id": "t4", "level": 4},
                 {"task_id": "t-none"}]
        ids = {t["task_id"]: [store.enqueue_one(t).rollout_id for _ in range(2)] for t in tasks}
        while store.dequeue(worker_id="w") is not None:
            pass
        steps = iter(range(10))
        grpo = parse_train_config({"grpo": {"replay": {"coef": 1.0, "levels": [1, 2]}}}).section
        draw = _replay_draws(grpo, 7, store, lambda: next(steps))
        all_ids = [r for rs in ids.values() for r in rs]
        first, second = draw(all_ids), draw(all_ids)
        assert first.rollouts == frozenset(ids["t1"] + ids["t2"] + ids["t-none"])
        assert first.seed == "spanlab-replay:7:0" and second.seed == "spanlab-replay:7:1"
        every = parse_train_config({"grpo": {"replay": {"coef": 1.0}}}).section
        assert _replay_draws(every, 7, store, lambda: 0)(all_ids) == ReplayDraw("spanlab-replay:7:0")
        assert _replay_draws(parse_train_config({}).section, 7, store, lambda: 0)(all_ids) is None

        samples = [_sample(rid, tid, 1.0, seed=1) for tid, rids in ids.items() for rid in rids] + _mixed_group()
        _, metrics = _step(_plain().model_copy(update={"replay": ReplayTerm(coef=0.3, levels=(1, 2))}), samples,
                           replay=first)
        assert metrics["replay_groups_solved"] == 3.0 and metrics["replay_rows"] == 3.0  # t1, t2, t-none; not t4


@pytest.mark.parametrize(("replay", "message"), [
    ({"coef": 0}, "greater than 0"),
    ({"coef": 1, "per_step": 0}, "greater than or equal to 1"),
    ({"coef": 1, "levels": []}, "at least 1 item"),
    ({"coef": 1, "solved_reward": float("nan")}, "finite number"),
    ({"coef": 1, "per_stp": 4}, "per_stp"),
    ({"per_step": 4}, "coef"),
])
def test_a_bad_replay_section_names_its_key(replay: dict[str, object], message: str) -> None:
    with pytest.raises((ValidationError, ConfigError), match=message):
        parse_train_config({"grpo": {"replay": replay}})


BASE = {"agent": {"name": "calc"}, "dataset": {"name": "calc", "levels": [1, 2, 3, 4], "train_levels": [3, 4]}}


@pytest.mark.parametrize(("extra", "message"), [
    ({"trainer": {"processes": 2}}, r"grpo\.replay: the replay term trains one policy in one trainer process"),
    ({"policies": {"roles": {"writer": "a"}}}, r"grpo\.replay: .* drop policies"),
    ({"grpo": {"replay": {"coef": 1.0, "levels": [1, 5]}}}, r"grpo\.replay\.levels: \[5\] not among dataset\.levels"),
    ({"grpo": {"replay": {"coef": 1.0, "levels": [1, 2]}}},
     r"grpo\.replay\.levels: none of \[1, 2\] is a level RL trains on \[3, 4\]"),
])
def test_replay_where_it_cannot_run_is_refused_before_anything_starts(extra: dict[str, object], message: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)  # two ranks pass the device check on any machine
    data = copy.deepcopy(BASE) | {"grpo": {"replay": {"coef": 1.0, "levels": [3]}}} | extra
    config = parse_train_config(data)
    with pytest.raises(ConfigError, match=message):
        build_algorithm(config)
    build_algorithm(parse_train_config(copy.deepcopy(BASE) | {"grpo": {"replay": {"coef": 1.0, "levels": [1, 2, 3]}}}))


def test_the_cli_check_gives_the_levels_error_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("algorithm: grpo\nagent: {name: calc, kwargs: {max_tokens: 32}}\ndataset: {name: calc, levels: "
                    f"[1, 2]}}\ngrpo: {{replay: {{coef: 1.0, levels: [3]}}}}\ndb: {tmp_path}/run.duckdb\n"
                    f"out_dir: {tmp_path}/runs\n")
    result = CliRunner().invoke(app, ["train", str(path), "--check"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and "Traceback" not in result.output
    assert re.search(r"grpo\.replay\.levels: \[3\] not among dataset\.levels \[1, 2\]",
                     " ".join(result.output.split())), result.output
