"""A few GRPO steps on a toy task raise the reward: tiny random Llama, sampled with torch, through a real store.

The task: 4 prompts of random tokens; the reward is the fraction of the 6 response tokens that are even
IDs (about 0.5 for a random policy). Each step samples 8 responses per prompt, records them as spans with
the sampling logprobs and a final reward, reads them back with ``iter_samples`` and runs ``grpo_step``.
Also here: ``grpo_step``'s exact gradient accumulation, dropped no-signal groups, epochs, KL, model loading.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.advantages import cancel_identical, sample_advantages
from spanlab.algos.grpo.update import GRPOConfig, LoraConfig, grpo_step, make_model_for_training
from spanlab.store import SpanStore
from spanlab.training.model import MissingDependencyError
from spanlab.types import LLMCall, Rollout, Span, reward_span

VOCAB, PROMPT_LEN, RESPONSE_LEN, TASKS, GROUP = 16, 4, 6, 4, 8


def _tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0)
    return LlamaForCausalLM(config)


@torch.no_grad()
def _sample(model: torch.nn.Module, prompts_N_P: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Responses ``[N, R]`` sampled at temperature 1 and their logprobs, as an engine would return them."""
    model.eval()
    seq_N_T = prompts_N_P
    logprobs = []
    for _ in range(RESPONSE_LEN):
        logp_N_V = torch.log_softmax(model(input_ids=seq_N_T).logits[:, -1].float(), -1)
        tok_N = torch.multinomial(logp_N_V.exp(), 1, generator=gen)
        logprobs.append(logp_N_V.gather(1, tok_N))
        seq_N_T = torch.cat([seq_N_T, tok_N], 1)
    return seq_N_T[:, PROMPT_LEN:], torch.cat(logprobs, 1)


def _reward(response_R: torch.Tensor) -> float:
    return float((response_R % 2 == 0).float().mean())


def _record_group(store: SpanStore, prompts_T_P: torch.Tensor, model: torch.nn.Module,
                  gen: torch.Generator) -> tuple[list[str], float]:
    """One batch of rollouts (GROUP per task) recorded as llm_call + reward spans; returns ids and mean reward."""
    prompts_N_P = prompts_T_P.repeat_interleave(GROUP, 0)
    responses_N_R, logprobs_N_R = _sample(model, prompts_N_P, gen)
    rollouts = store.enqueue([Rollout(input={"task_id": n // GROUP}) for n in range(len(prompts_N_P))])
    rewards = [_reward(r_R) for r_R in responses_N_R]
    spans, attempt_ids = [], []
    for n, rollout in enumerate(rollouts):
        got = store.dequeue(worker_id="w")
        assert got is not None and got[0].rollout_id == rollout.rollout_id
        attempt_ids.append(got[1].attempt_id)
        call = LLMCall(model="tiny", prompt_token_ids=prompts_N_P[n].tolist(),
                       response_token_ids=responses_N_R[n].tolist(), response_logprobs=logprobs_N_R[n].tolist())
        spans += [Span(rollout_id=rollout.rollout_id, attempt_id=got[1].attempt_id, name="chat", kind="llm_call",
                       llm=call), reward_span(rollout.rollout_id, got[1].attempt_id, rewards[n])]
    store.add_spans(spans)
    for attempt_id in attempt_ids:
        store.finish_attempt(attempt_id, "succeeded")
    ids = [r.rollout_id for r in rollouts]
    return ids, float(np.mean(rewards))


def _mean_reward(model: torch.nn.Module, prompts_T_P: torch.Tensor, gen: torch.Generator, n: int = 64) -> float:
    responses_N_R, _ = _sample(model, prompts_T_P.repeat_interleave(n, 0), gen)
    return float(np.mean([_reward(r) for r in responses_N_R]))


@pytest.mark.usefixtures("one_thread")
def test_grpo_raises_the_reward_on_a_toy_task() -> None:
    model = _tiny_model()
    gen = torch.Generator().manual_seed(1)
    prompts_T_P = torch.randint(1, VOCAB, (TASKS, PROMPT_LEN), generator=gen)
    config = GRPOConfig(lr=1e-2, group_size=GROUP, micro_batch_tokens=64, clip_high=0.28)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    before = _mean_reward(model, prompts_T_P, gen)
    history = []
    with SpanStore(":memory:") as store:
        for _ in range(6):
            ids, batch_reward = _record_group(store, prompts_T_P, model, gen)
            samples = list(iter_samples(store, ids))
            assert len(samples) == TASKS * GROUP
            metrics = grpo_step(model, optimizer, samples, config, pad_id=0)
            history.append(metrics)
            assert metrics["reward_mean"] == batch_reward
    after = _mean_reward(model, prompts_T_P, gen)
    assert 0.35 < before < 0.65
    assert after > before + 0.25, (before, after, [round(m["reward_mean"], 3) for m in history])
    first = history[0]
    assert first["skipped"] == 0.0 and first["n_groups_with_signal"] >= 1 and first["tokens_per_s"] > 0
    assert first["n_samples_used"] <= first["n_samples"] == TASKS * GROUP
    assert 0.98 < first["tis_weight_mean"] < 1.02  # the trainer is the sampler: importance weights ~1
    assert first["ratio_mean"] == 1.0  # one epoch: old logprobs are the current ones
    assert all(np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"]) for m in history)


def _batch(seed: int, rewards: list[float], groups: list[str]) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        n_prompt, n_resp = 3 + i % 3, 2 + i % 4
        mask = np.r_[np.zeros(n_prompt, np.uint8), np.ones(n_resp, np.uint8)]
        engine = np.where(mask == 1, -rng.random(len(mask)), 0).astype(np.float32)
        out.append(Sample(f"r{i}", g, rng.integers(1, VOCAB, len(mask)).astype(np.int32), mask, engine, r))
    return out


@pytest.mark.usefixtures("one_thread")
def test_micro_batching_gives_the_same_update_as_one_batch() -> None:
    samples = _batch(0, [1.0, 0.0, 0.5, 0.0, 1.0, 1.0], ["a", "a", "a", "b", "b", "b"])
    params = []
    for budget, aggregation in [(4096, "token_mean"), (8, "token_mean"), (4096, "seq_mean"), (8, "seq_mean")]:
        model = _tiny_model()
        config = GRPOConfig(micro_batch_tokens=budget, aggregation=aggregation, max_grad_norm=1e9)
        metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, config, pad_id=0)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert metrics["n_samples_used"] == 6
    torch.testing.assert_close(params[0], params[1], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(params[2], params[3], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(params[0], params[2])  # the aggregations differ


@pytest.mark.usefixtures("one_thread")
def test_groups_without_signal_are_dropped_and_epochs_and_kl_run() -> None:
    model, ref = _tiny_model(), _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    flat = _batch(1, [1.0, 1.0, 0.0, 0.0], ["a", "a", "b", "b"])
    skipped = grpo_step(model, optimizer, flat, GRPOConfig(), pad_id=0)
    assert skipped["skipped"] == 1.0 and skipped["n_groups_with_signal"] == 0
    mixed = _batch(2, [1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"])
    config = GRPOConfig(epochs_per_batch=3, kl_beta=0.1, clip_low=0.01, clip_high=0.01)
    metrics = grpo_step(model, optimizer, mixed, config, pad_id=0, ref_model=ref)
    assert metrics["n_groups_with_signal"] == 1 and metrics["n_samples_used"] == 2
    assert metrics["ratio_mean"] != 1.0 and metrics["kl"] > 0  # later epochs moved away from old and ref
    assert metrics["clip_frac"] > 0
    with pytest.raises(ValueError, match="ref_model"):
        grpo_step(model, optimizer, mixed, config, pad_id=0)


def _copies(sample: Sample, rewards: list[float], group: str, name: str = "x") -> list[Sample]:
    """``sample``'s tokens once per reward: a role whose output did not vary while the rollouts' rewards did."""
    return [Sample(f"{name}{i}", group, sample.input_ids.copy(), sample.loss_mask.copy(),
                   sample.engine_logprobs.copy(), r) for i, r in enumerate(rewards)]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("rewards", [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
def test_identical_samples_whose_advantages_cancel_are_a_group_without_signal(rewards: list[float]) -> None:
    """Three or four copies of one sequence with varying rewards: their advantages sum to zero, so the gradient is
    zero (3 copies) or a rounding residue that Adam would turn into a full lr step (4 copies). The group has no
    signal: the step is skipped and the weights stay bit-identical, as for a group with equal rewards; with a group
    that has signal beside it, the update is the one of that group alone."""
    [one] = _batch(3, [0.0], ["a"])
    identical = _copies(one, rewards, "a")
    model = _tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    metrics = grpo_step(model, optimizer, identical, GRPOConfig(), pad_id=0)
    assert metrics["skipped"] == 1.0 and metrics["n_groups_with_signal"] == 0 and metrics["n_groups_cancelled"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    varied = _batch(4, [1.0, 0.0, 0.5], ["b", "b", "b"])
    updated = []
    for samples in (identical + varied, varied):
        model = _tiny_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        metrics = grpo_step(model, optimizer, samples, GRPOConfig(), pad_id=0)
        assert metrics["skipped"] == 0.0 and metrics["n_groups_with_signal"] == 1
        assert metrics["n_samples_used"] == len(varied)
        updated.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*updated, strict=True))


def test_identical_samples_keep_their_advantages_when_they_do_not_cancel() -> None:
    """Two copies of one sequence beside another sequence: the copies' advantages sum to its share of the signal."""
    [x] = _batch(5, [0.0], ["a"])
    [y] = _batch(6, [0.0], ["a"])
    samples = [*_copies(x, [0.0, 1.0], "a"), *_copies(y, [1.0], "a", "y")]
    adv = sample_advantages(samples)
    np.testing.assert_array_equal(cancel_identical(samples, adv), adv)
    assert cancel_identical(samples[:2], sample_advantages(samples[:2])).tolist() == [0.0, 0.0]


def test_make_model_for_training_full_and_lora(tmp_path) -> None:
    _tiny_model().save_pretrained(tmp_path)
    model, optimizer = make_model_for_training(tmp_path, GRPOConfig(lr=1e-3))
    assert model.training and optimizer.param_groups[0]["lr"] == 1e-3
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == sum(
        p.numel() for p in model.parameters())
    lora = GRPOConfig(lora=LoraConfig(rank=4, alpha=8))
    if importlib.util.find_spec("peft") is None:
        with pytest.raises(MissingDependencyError, match="peft"):
            make_model_for_training(tmp_path, lora)
    else:
        model, optimizer = make_model_for_training(tmp_path, lora)
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trained and all("lora_" in n for n in trained)


def test_the_kl_reference_is_the_policy_as_rl_starts_frozen() -> None:
    """``grpo.kl_beta`` in a job: the loop keeps a frozen copy of the warm-started policy as the reference (a run
    with kl_beta used to fail at its first step for want of one); data-parallel ranks refuse it at --check."""
    from spanlab.algos.grpo.loop import _reference
    from spanlab.errors import ConfigError
    from spanlab.jobs.config import parse_train_config
    from spanlab.jobs.job import build_algorithm

    model = _tiny_model()
    ref = _reference(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    assert not torch.equal(next(model.parameters()), next(ref.parameters()))  # a copy, not the same tensors
    with pytest.raises(ConfigError, match=r"grpo\.kl_beta: .*one trainer process"):
        build_algorithm(parse_train_config({"grpo": {"kl_beta": 0.05}, "trainer": {"processes": 2}}))
