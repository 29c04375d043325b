"""``spanlab compare --pool``: two splits compared as one, each question paired with itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanlab.compare import compare
from spanlab.compare.pools import parse_pools, with_pools
from spanlab.compare.runs import HeldOutScores
from spanlab.errors import ConfigError


def _scores(label: str, test: list[float], family: list[float], seed: int | None = 0,
            extra_ops: dict[str, float] | None = None) -> HeldOutScores:
    rewards = {"test": {f"q{i}": r for i, r in enumerate(test)}, "family": {f"q{i}": r for i, r in enumerate(family)}}
    return HeldOutScores(label, Path(f"{label}.duckdb"), "final", seed, rewards, extra_ops or {})


def test_a_pool_is_the_union_of_its_splits_questions_paired_with_themselves() -> None:
    # the same task ids on both splits: the pool keeps them apart (split/task_id), so 8 questions, not 4
    start = _scores("start", [1, 0, 0, 0], [1, 1, 0, 0], None, {"test": 0.0, "family": 0.5})
    final = _scores("arm-s0", [1, 1, 1, 0], [1, 1, 0, 0], 0, {"test": 0.25, "family": 0.25})
    pools = parse_pools(["levels 1-3=test+family"])
    pooled_start, pooled_final = with_pools(start, pools), with_pools(final, pools)
    assert len(pooled_final.rewards["levels 1-3"]) == 8 and pooled_final.rewards["levels 1-3"]["test/q1"] == 1
    assert pooled_start.extra_ops["levels 1-3"] == 0.25 and pooled_final.extra_ops["levels 1-3"] == 0.25
    result = compare(pooled_start, {"arm": [pooled_final]})
    gains = {s.split: s.arms[0].gain.mean for s in result.splits}
    assert gains == pytest.approx({"test": 0.5, "family": 0.0, "levels 1-3": 0.25})  # 2 of 8 questions won
    # a part without a share: the pool has none either
    assert "levels 1-3" not in with_pools(_scores("x", [1], [1]), pools).extra_ops


@pytest.mark.parametrize(("specs", "message"), [
    (["levels"], r"give NAME=SPLIT\+SPLIT"),
    (["l=test"], "two or more different splits"),
    (["l=test+test"], "two or more different splits"),
    (["l=test+family", "l=test+family"], "a pool of that name was given already"),
])
def test_a_malformed_pool_is_refused_in_one_line(specs: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_pools(specs)


def test_a_pool_of_a_split_the_run_did_not_evaluate_or_named_as_a_split_is_refused() -> None:
    scores = _scores("arm-s0", [1], [0])
    with pytest.raises(ConfigError, match=r"arm-s0 did not evaluate depth \(its splits: test, family\)"):
        with_pools(scores, parse_pools(["l=test+depth"]))
    with pytest.raises(ConfigError, match="a split of that name exists"):
        with_pools(scores, parse_pools(["test=test+family"]))
