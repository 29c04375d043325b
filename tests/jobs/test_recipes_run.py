"""``tutorials/recipes/run.py``'s stages: every variant is the main job's GRPO from one start, one switch apart,
seeded; the sealed stage only evaluates."""

from __future__ import annotations

from pathlib import Path

from spanlab.config import load_yaml
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import build_algorithm
from tests.scripts import load_script

RECIPES = Path(__file__).resolve().parents[2] / "tutorials" / "recipes"
WHERE = ("run_name", "db")


def test_each_variant_is_the_reference_plus_its_own_switch_with_the_seed_it_names(tmp_path: Path) -> None:
    run = load_script(RECIPES / "run.py", "recipes_run")
    (tmp_path / "start" / "final").mkdir(parents=True)
    main_job = load_yaml(run.BASE)
    assert set(run.ARMS) >= {"reference", "lora", "kl"}
    start = run.stage_config("start", main_job, tmp_path, 1366)
    assert start["grpo"]["steps"] == 0 and start["rollouts"]["seed"] == 0 and "warm_start" in start
    configs = {f"{arm}-s{seed}": run.stage_config(f"{arm}-s{seed}", main_job, tmp_path, 1366)
               for arm in run.ARMS for seed in (0, 2)}
    for name, data in configs.items():
        config = parse_train_config(data, name)
        build_algorithm(config)
        assert config.run_dir == tmp_path / name and config.rollouts.seed == int(name[-1])
        assert config.engine.model == str(tmp_path / "start" / "final") and config.warm_start is None
        assert not config.eval.base
    reference = {k: v for k, v in configs["reference-s0"].items() if k not in WHERE}
    for arm in run.ARMS:
        ours = {k: v for k, v in configs[f"{arm}-s0"].items() if k not in WHERE}
        differs = {k for k in reference if ours.get(k) != reference[k]} | (set(ours) - set(reference))
        assert differs <= {"grpo"}, (arm, differs)  # one section: the switch
        grpo_diff = {k for k in reference["grpo"] if ours["grpo"].get(k) != reference["grpo"][k]} | \
            (set(ours["grpo"]) - set(reference["grpo"]))
        assert len(grpo_diff) <= 2, (arm, grpo_diff)  # the switch and, for LoRA, its learning rate
    assert configs["reference-s2"]["rollouts"]["seed"] == 2


def test_the_sealed_stage_only_evaluates_the_sealed_split(tmp_path: Path) -> None:
    run = load_script(RECIPES / "run.py", "recipes_run")
    (tmp_path / "lora-s0" / "final").mkdir(parents=True)
    data = run.sealed_config("lora-s0", load_yaml(run.BASE), tmp_path, 150)
    config = parse_train_config(data, "sealed")
    build_algorithm(config)
    assert data["grpo"]["steps"] == 0 and config.warm_start is None and not config.checkpoints.final
    assert config.engine.model == str(tmp_path / "lora-s0" / "final")
    assert [s.name for s in config.eval.split_specs] == ["test", "sealed"] and config.eval.base
    assert config.run_dir == tmp_path / "sealed-lora-s0"
