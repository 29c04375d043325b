"""The data-parallel GRPO update (``trainer.processes``) against one process, with 2 real gloo ranks on 127.0.0.1.

The key check: after one update of the same batch, rank 0's parameters equal those of one process on the
whole batch, within atol 1e-6 in float32 (only the summation order differs: each rank sums its shard's
gradients, then gloo sums the ranks). SGD without clipping (lr 1.0, max_grad_norm 1e9) so the update is
the gradient itself: a gradient averaged instead of summed over ranks, or a loss normalized by a shard's
own token count, moves the parameters by a visibly different amount (Adam's first step would hide a scale
error). The helper's parameters are compared with rank 0's through their float64 fingerprints. The same
check for ``sharding: fsdp`` compares the full state dict gathered from both ranks' shards (what the
weight push sends) with the single process's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import build_algorithm
from spanlab.training.data_parallel import DataParallel, TrainerError, load_trainable_model
from spanlab.training.trainer_config import TrainerConfig

VOCAB = 16
SAMPLES_SEED = 0
CONFIG = GRPOConfig(micro_batch_tokens=24, max_grad_norm=1e9)  # token_mean: normalized by all loss tokens


def _toy_model(out: Path, *, tied: bool) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0,
                         tie_word_embeddings=tied)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama (32 hidden, vocab 16) saved as an HF folder: what a helper rank loads."""
    return _toy_model(tmp_path_factory.mktemp("toy") / "model", tied=False)


def _batch(seed: int, n: int, shared: int = 0) -> list[Sample]:
    """``n`` samples of varied prompt/response lengths in groups of 4, rewards with variance in each group;
    the first ``shared`` prompt tokens are the same in all (an agent's system prompt: run once per micro-batch)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(1, VOCAB, shared).astype(np.int32)
    out = []
    for i in range(n):
        n_prompt, n_resp = shared + 3 + i % 5, 2 + (i * 7) % 6
        mask = np.r_[np.zeros(n_prompt, np.uint8), np.ones(n_resp, np.uint8)]
        engine = np.where(mask == 1, -rng.random(len(mask)), 0).astype(np.float32)
        reward = float(rng.integers(0, 2)) if i % 4 else float(i % 8 == 0)  # first of a group: 1 or 0
        ids = np.r_[prefix, rng.integers(1, VOCAB, len(mask) - shared)].astype(np.int32)
        out.append(Sample(f"r{i}", f"g{i // 4}", ids, mask, engine, reward))
    return out


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_two_gloo_ranks_take_the_single_process_step(toy_model_dir: Path) -> None:
    samples, config = _batch(SAMPLES_SEED, 12), CONFIG
    seq_config = config.model_copy(update={"aggregation": "seq_mean"})  # normalized by the sequence count
    sgd = partial(torch.optim.SGD, lr=1.0)
    single = load_trainable_model(toy_model_dir)
    optimizer = sgd(single.parameters())
    start_P = _flat(single)
    one = grpo_step(single, optimizer, samples, config, pad_id=0)
    single_after_one_P = _flat(single)
    one_seq = grpo_step(single, optimizer, samples, seq_config, pad_id=0)

    rank0 = load_trainable_model(toy_model_dir)
    with DataParallel(rank0, partial(load_trainable_model, toy_model_dir), sgd, TrainerConfig(processes=2),
                      threads=2) as dp:
        two = dp.run(grpo_step, samples=samples, config=config, pad_id=0)
        after_one_P = _flat(rank0)
        two_seq = dp.run(grpo_step, samples=samples, config=seq_config, pad_id=0)
        fingerprints = dp.fingerprints()

    assert one["n_samples_used"] == two["n_samples_used"] >= 8  # enough kept samples for two shards
    assert (single_after_one_P - start_P).abs().max() > 1e-2  # the step really moved the parameters
    torch.testing.assert_close(after_one_P, single_after_one_P, rtol=0, atol=1e-6)
    torch.testing.assert_close(_flat(rank0), _flat(single), rtol=0, atol=1e-6)  # and the seq_mean step after it
    for key in ("loss", "grad_norm", "loss_tokens", "clip_frac", "ratio_mean", "tokens"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
        assert two_seq[key] == pytest.approx(one_seq[key], rel=1e-5), key
    (sum0, sq0), (sum1, sq1) = fingerprints
    assert sum0 == pytest.approx(sum1, rel=1e-12) and sq0 == pytest.approx(sq1, rel=1e-12)  # the ranks agree


def test_two_fsdp_ranks_take_the_single_process_step(tmp_path: Path) -> None:
    """FSDP2 over 2 gloo ranks: tied embeddings (SmolLM2's; one FSDP group must hold both), a 16-token shared
    prefix (the decoder runs twice in a forward) and 3 vs 4 micro-batches on the ranks (rank 0 runs a filler)."""
    model_dir = _toy_model(tmp_path / "tied", tied=True)
    samples = _batch(1, 12, shared=16)
    config = GRPOConfig(micro_batch_tokens=56, max_grad_norm=1e9)
    sgd = partial(torch.optim.SGD, lr=1.0)
    single = load_trainable_model(model_dir)
    start = {k: v.clone() for k, v in single.state_dict().items()}
    one = grpo_step(single, sgd(single.parameters()), samples, config, pad_id=0)

    rank0 = load_trainable_model(model_dir)
    with DataParallel(rank0, partial(load_trainable_model, model_dir), sgd,
                      TrainerConfig(processes=2, sharding="fsdp"), threads=2) as dp:
        two = dp.run(grpo_step, samples=samples, config=config, pad_id=0)
        gathered = dp.full_state_dict()

    assert one["n_samples_used"] == two["n_samples_used"] == 12
    expected = single.state_dict()
    assert gathered.keys() == expected.keys()
    assert max(float((expected[k] - start[k]).abs().max()) for k in expected) > 1e-2  # the step moved them
    for key, tensor in expected.items():
        torch.testing.assert_close(gathered[key], tensor, rtol=0, atol=1e-6, msg=key)
    for key in ("loss", "grad_norm", "loss_tokens", "clip_frac", "ratio_mean", "tokens"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key


def _fail_to_build() -> torch.nn.Module:
    raise RuntimeError("no model here")


def test_a_rank_that_dies_before_joining_is_an_error_not_a_hang(toy_model_dir: Path) -> None:
    model = load_trainable_model(toy_model_dir)
    dp = DataParallel(model, _fail_to_build, partial(torch.optim.SGD, lr=1.0), TrainerConfig(processes=2))
    with pytest.raises(TrainerError, match=r"^trainer.processes: rank 1 exited with code 1 before joining"), dp:
        pass


def test_more_processes_than_devices_is_a_config_error_naming_the_key() -> None:
    config = parse_train_config({"trainer": {"processes": 1024}})
    with pytest.raises(ConfigError, match=r"^trainer.processes: 1024 processes but this machine has \d+ CPU cores"):
        build_algorithm(config)
    gpu = parse_train_config({"trainer": {"processes": 2, "device": "gpu"}})
    if torch.cuda.device_count() == 1:
        with pytest.raises(ConfigError, match=r"^trainer.processes: 2 processes but torch sees 1 GPU \("):
            build_algorithm(gpu)
    one_gpu = parse_train_config({"trainer": {"device": "gpu"}})  # the one-process trainer on the GPU
    assert (one_gpu.trainer.policy_device, gpu.trainer.policy_device) == ("cuda", "cpu")
    if torch.cuda.device_count() == 0:
        for config in (gpu, one_gpu):
            with pytest.raises(ConfigError, match=r"^trainer.device: gpu but torch \S+ sees no GPU \(set trainer"):
                build_algorithm(config)
    apo = parse_train_config({"algorithm": "apo", "trainer": {"device": "gpu"}})
    with pytest.raises(ConfigError, match=r"^trainer.device: algorithm 'apo' trains no weights; remove trainer"):
        build_algorithm(apo)
    with pytest.raises(ConfigError, match=r"trainer.processes: Input should be greater than or equal to 1"):
        parse_train_config({"trainer": {"processes": 0}})
    with pytest.raises(ConfigError, match=r"trainer: sharding: fsdp shards the model over the ranks"):
        parse_train_config({"trainer": {"sharding": "fsdp"}})
    lora = parse_train_config({"trainer": {"processes": 2, "sharding": "fsdp"}, "grpo": {"lora": {"rank": 4}}})
    with pytest.raises(ConfigError, match=r"^trainer.sharding: fsdp trains full weights, not a LoRA adapter"):
        build_algorithm(lora)


def test_the_jobs_trainer_on_two_ranks_takes_its_one_process_step(toy_model_dir: Path, tmp_path: Path) -> None:
    """The framework's trainer (``Job.trainer``) chosen by ``trainer.processes``: two ranks run GRPO's step function
    (a ``functools.partial``, pickled into the spawned rank) and leave rank 0's model where one process does."""
    from contextlib import ExitStack

    from spanlab.jobs.trainer import build_trainer
    from spanlab.training.policy import Policy
    from spanlab.training.trainers import OneProcessTrainer, RanksTrainer

    samples = _batch(SAMPLES_SEED, 12)
    step = partial(grpo_step, config=CONFIG, pad_id=0)  # as grpo_step_function builds it (without kl_beta)
    base = {"algorithm": "grpo", "dataset": {"name": "calc"}, "engine": {"model": str(toy_model_dir)},
            "db": str(tmp_path / "r.duckdb"), "out_dir": str(tmp_path / "runs"), "torch_threads": 2}
    got = {}
    for processes in (1, 2):
        config = parse_train_config({**base, "trainer": {"processes": processes}})
        policy = Policy(load_trainable_model(toy_model_dir), None, 0, None)  # type: ignore[arg-type]  # no push
        start_P = _flat(policy.model)
        with ExitStack() as stack:
            trainer = build_trainer(policy, config, stack, step, partial(torch.optim.SGD, lr=1.0), lora=None,
                                    adapters=None)
            metrics = trainer.update(lambda roles: iter(samples), demos=None)
        got[processes] = (type(trainer), metrics, _flat(policy.model))
    assert got[1][0] is OneProcessTrainer and got[2][0] is RanksTrainer
    assert (got[1][2] - start_P).abs().max() > 1e-2  # the step really moved the parameters
    torch.testing.assert_close(got[2][2], got[1][2], rtol=0, atol=1e-6)
    for key in ("loss", "grad_norm", "n_samples_used"):
        assert got[2][1][key] == pytest.approx(got[1][1][key], rel=1e-5), key
