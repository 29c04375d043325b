"""The generated arithmetic tasks: deterministic per seed, disjoint splits, correct answers."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from spanlab.agents.calc.mcp_server import evaluate
from spanlab.agents.calc.phrasings import HELD_OUT, TRAIN, choose_variant, first_variant, variants
from spanlab.agents.calc.tasks import ALL_LEVELS, ITEMS, KINDS, LEVELS, NAMES, make_tasks, split_of, templates_of
from spanlab.jobs.config import load_train_config


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    assert make_tasks("train", 30, seed=3) == make_tasks("train", 30, seed=3)
    assert make_tasks("train", 30, seed=3) != make_tasks("train", 30, seed=4)
    assert make_tasks("val", 40, seed=1)[:20] == make_tasks("val", 20, seed=1), "a larger n extends a smaller one"


def test_tasks_are_json_and_well_formed() -> None:
    tasks = make_tasks("test", 60, seed=0)
    assert json.loads(json.dumps(tasks)) == tasks
    assert [t["level"] for t in tasks[:6]] == [1, 2, 3, 1, 2, 3]
    for t in tasks:
        assert {"task_id", "question", "answer", "level", "split"} <= t.keys()
        assert t["split"] == "test" and type(t["answer"]) is int and 0 <= t["answer"] < 10_000
        assert t["task_id"].startswith("calc-")
    assert len({t["question"] for t in tasks}) == len({t["task_id"] for t in tasks}) == 60


def test_answers_are_correct() -> None:
    """The answer is the value of the expression, and the expression uses the question's numbers."""
    for t in make_tasks("train", 300, seed=7):
        assert evaluate(t["expression"]) == str(t["answer"])
        numbers = [tok.strip("()") for tok in t["expression"].split() if tok.strip("()").isdigit()]
        assert all(n in t["question"] for n in numbers), t


@pytest.mark.parametrize("level", [1, 2, 3])
def test_levels(level: int) -> None:
    tasks = make_tasks("train", 20, seed=0, levels=[level])
    assert {t["level"] for t in tasks} == {level}
    ops = [sum(t["expression"].count(op) for op in "+-*/") for t in tasks]
    if level == 1:
        assert all(t["question"].startswith("What is ") for t in tasks) and set(ops) == {1}
    else:
        assert not any(t["question"].startswith("What is ") for t in tasks)
        assert set(ops) == ({1} if level == 2 else {2})


def test_splits_never_share_a_question_whatever_the_seed() -> None:
    by_question = ("train", "val", "test")
    questions = {s: {t["question"] for seed in (0, 1, 2) for t in make_tasks(s, 150, seed=seed)} for s in by_question}
    assert not questions["train"] & questions["val"]
    assert not questions["train"] & questions["test"]
    assert not questions["val"] & questions["test"]
    assert all(split_of(q) == s for s, qs in questions.items() for q in qs)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="split"):
        make_tasks("dev", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="levels"):
        make_tasks("train", 3, levels=[9])
    with pytest.raises(ValueError, match="phrasings"):
        make_tasks("train", 3, phrasings="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no depth split beyond level 5"):
        make_tasks("depth", 3, levels=[5])
    assert make_tasks("train", 0) == []


def test_original_phrasings_are_the_tutorials_questions() -> None:
    """Pinned before phrasing families existed: the main job's tasks did not change with them."""
    tasks = [make_tasks(s, 90, 0, (1, 2, 3)) for s in ("train", "val", "test")]
    plain = [[{k: v for k, v in t.items() if k != "family"} for t in ts] for ts in tasks]
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()
    assert digest == "56b254c17a6e6b1a19ff585d5678559fcfd943c230e7950681db0766b3cc7a17"
    assert {t["family"].rsplit("/", 1)[1] for ts in tasks for t in ts} == {"0"}


def test_level_four_families_leave_the_demonstrated_levels_tasks_as_they_were() -> None:
    """Level 4 is trained in as many wording families per kind as levels 1-3 (issue 59: two were too few), and
    adding them changed no task of levels 1-3 (each level draws from a stream of its own): a warm start made
    before them is still the main job's. Pinned with 2 level-4 families per kind."""
    assert all(len(TRAIN[k]) >= 10 for k in KINDS[4])
    tasks = [t for s in ("train", "val", "test") for t in make_tasks(s, 360, 0, (1, 2, 3, 4), phrasings="all")
             if t["level"] <= 3]
    digest = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
    assert digest == "b4d2caf86b848fd501417fed8beb7f0e14f7d2b40226a67a1359266c42ba993b"


def test_family_split_uses_only_templates_no_other_split_uses() -> None:
    used = {t["family"] for s in ("train", "val", "test") for seed in (0, 1)
            for t in make_tasks(s, 300 if s == "train" else 60, seed=seed, phrasings="all")}
    family = make_tasks("family", 200, seed=0)
    assert all("/held-out/" in t["family"] for t in family) and not used & {t["family"] for t in family}
    assert len({t["family"] for t in family}) == sum(len(HELD_OUT[k]) for lv in LEVELS for k in KINDS[lv])
    kinds_trained = {f.split("/")[0] for f in used}
    assert {t["family"].split("/")[0] for t in family} <= kinds_trained, "the same problem kinds, new wording"
    train_questions = {t["question"] for t in make_tasks("train", 2000, seed=0, phrasings="all")}
    assert not train_questions & {t["question"] for t in family}
    for t in family:
        assert evaluate(t["expression"]) == str(t["answer"])


def test_every_level_has_a_family_split() -> None:
    """A run that trains levels 4 (``levels: [1, 2, 3, 4]``) gets a family split of its own levels: every kind
    has held-out templates (a missing one made ``spanlab train --check`` crash with a KeyError)."""
    for kind in (k for lv in ALL_LEVELS for k in KINDS[lv]):
        assert len(HELD_OUT[kind]) >= 2, kind
    family = make_tasks("family", 500, seed=0, levels=ALL_LEVELS)
    assert {t["level"] for t in family} == set(ALL_LEVELS)
    assert len({t["family"] for t in family}) == sum(len(HELD_OUT[k]) for lv in ALL_LEVELS for k in KINDS[lv])
    for t in family:
        assert evaluate(t["expression"]) == str(t["answer"])
        assert "{" not in t["question"], t["question"]


def test_all_phrasings_use_every_training_template_and_keep_the_question_splits() -> None:
    tasks = make_tasks("train", 600, seed=0, phrasings="all")
    templates = {f"{k}/{i}" for lv in LEVELS for k in KINDS[lv] for i in range(len(TRAIN[k]))}
    assert {t["family"] for t in tasks} == templates
    assert all(split_of(t["question"]) == "train" for t in tasks)


@pytest.mark.parametrize(("levels", "depth_level", "ops"), [((1, 2, 3), 4, 3), ((3, 4), 5, 4)])
def test_depth_split_has_one_more_operation_than_any_asked_level(levels: tuple[int, ...], depth_level: int,
                                                                ops: int) -> None:
    tasks = make_tasks("depth", 80, seed=0, levels=levels)
    assert {t["level"] for t in tasks} == {depth_level}
    assert {sum(t["expression"].count(op) for op in "+-*/") for t in tasks} == {ops}
    for t in tasks:
        assert evaluate(t["expression"]) == str(t["answer"]) and 0 <= t["answer"] < 10_000, t


def test_all_phrasings_are_stratified_over_templates() -> None:
    """Each level's tasks take its templates in turn: any window of one cycle uses each template once."""
    levels = (1, 2, 3)
    for split in ("train", "val", "test"):
        longest = max(len(templates_of(level)) for level in levels)
        tasks = make_tasks(split, len(levels) * longest * 2, seed=0, levels=levels, phrasings="all")
        for level in levels:
            cycle = [f"{k}/{i}" for k, i in templates_of(level)]
            of_level = [t["family"] for t in tasks if t["level"] == level]
            assert of_level[: 2 * len(cycle)] == cycle + cycle, (split, level)
            assert {k for k, _ in templates_of(level)} == set(KINDS[level])


CALC_TUTORIAL = Path(__file__).parents[2] / "tutorials/calc"


@pytest.mark.parametrize("name", ["grpo.yaml"])
def test_the_main_jobs_demonstrations_cover_every_training_template_of_the_demonstrated_levels(name: str) -> None:
    """The warm start's demos show every wording family of every demonstrated level at least once (the 64
    random-template demos of an earlier config covered 26 of 36), and not one level-4 problem: level 4 is what RL
    alone must teach (its train draws hold them)."""
    from spanlab.jobs.job import check_job

    config = load_train_config(CALC_TUTORIAL / name)
    assert config.warm_start is not None and config.dataset.kwargs.get("phrasings") == "all"
    _, _, splits = check_job(config)
    demos = splits["demos"][: config.warm_start.demos]
    shown = config.warm_start.levels or config.dataset.levels
    assert len(demos) == config.warm_start.demos and {t["level"] for t in demos} == set(shown) == {1, 2, 3}
    templates = {f"{k}/{i}" for lv in shown for k in KINDS[lv] for i in range(len(TRAIN[k]))}
    assert {t["family"] for t in demos} == templates
    assert 4 in {t["level"] for t in splits["rl"]}


def _word_grams(template: str, n: int) -> set[tuple[str, ...]]:
    """The ``n``-word stretches within each sentence (a stretch across a full stop is no shared wording)."""
    grams = set()
    for sentence in re.split(r"[.?;]", template.lower()):
        words = re.findall(r"\{?\w+\}?", sentence)
        grams |= {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
    return grams


STOCK_QUESTIONS = {("how", "many", "{item}", "does", "{name}", "have", "left"),
                   ("what", "is", "the", "total", "number", "of", "{item}")}


def test_training_wordings_do_not_copy_held_out_ones() -> None:
    """The family split measures unseen wording only while no training template of any level repeats a
    held-out one or a seven-word stretch of one, stock questions aside."""
    train = [v for lv in ALL_LEVELS for k in KINDS[lv] for t in TRAIN[k] for v in variants(t)]
    assert len(set(train)) == len(train)
    for held_out in HELD_OUT.values():
        for h in held_out:
            assert h not in train
            for t in train:
                assert not (_word_grams(h, 7) & _word_grams(t, 7)) - STOCK_QUESTIONS, (h, t)


def test_a_wording_family_stands_for_every_combination_of_its_choices() -> None:
    template = "[Add|Sum] {a} and {b}[.|!]"
    assert variants(template) == ["Add {a} and {b}.", "Add {a} and {b}!", "Sum {a} and {b}.", "Sum {a} and {b}!"]
    assert first_variant(template) == "Add {a} and {b}." and variants("{a} + {b}") == ["{a} + {b}"]
    rng = random.Random(0)
    assert {choose_variant(template, rng) for _ in range(100)} == set(variants(template))


def test_all_phrasings_draw_many_wordings_per_family() -> None:
    """A family's questions are worded with its choices drawn per question, not one sentence per family."""
    tasks = make_tasks("train", 600, seed=0, levels=(2,), phrasings="all")
    of_family = [t for t in tasks if t["family"] == "l2_add/0"]
    # the slots' values differ between questions; what is left is the wording
    slot_values = re.compile(r"\b(\d+|" + "|".join(NAMES + ITEMS) + r")\b")
    wordings = {slot_values.sub("_", t["question"]) for t in of_family}
    assert len(of_family) >= 10 and len(wordings) >= 5, wordings


def test_sealed_split_is_pinned_and_words_no_question_like_any_other_split() -> None:
    """The sealed wordings (another hand's, from a spec alone) load only at their pinned digest, cover every kind of
    levels 1-3 with >= 8 templates, and no sealed question is a question of any other split."""
    from spanlab.agents.calc.sealed import SHA256, WORDINGS, sealed_templates

    assert hashlib.sha256(WORDINGS.read_bytes()).hexdigest() == SHA256
    templates = sealed_templates()
    assert set(templates) == {k for lv in LEVELS for k in KINDS[lv]}
    assert all(len(t) >= 8 for t in templates.values())
    sealed = make_tasks("sealed", 300, seed=0, levels=LEVELS)
    assert {t["level"] for t in sealed} == set(LEVELS) and all("/sealed/" in t["family"] for t in sealed)
    assert len({t["family"] for t in sealed}) > 100, "most sealed templates are used"
    others = {t["question"] for s in ("train", "val", "test", "family") for t in
              make_tasks(s, 2000 if s == "train" else 300, seed=0, phrasings="all" if s != "family" else "original")}
    assert not others & {t["question"] for t in sealed}
    for t in sealed:
        assert evaluate(t["expression"]) == str(t["answer"])
        assert "{" not in t["question"] and "}" not in t["question"], t["question"]
    assert make_tasks("sealed", 30, seed=0) == sealed[:30], "a larger n extends a smaller one"


def test_sealed_split_refuses_levels_it_does_not_word_and_a_changed_file(tmp_path: Path, monkeypatch) -> None:
    from spanlab.agents.calc import sealed

    with pytest.raises(ValueError, match="sealed split words levels"):
        make_tasks("sealed", 4, levels=(1, 4))
    changed = tmp_path / "sealed_wordings.json"
    changed.write_text(sealed.WORDINGS.read_text().replace("What is", "What's", 1))
    monkeypatch.setattr(sealed, "WORDINGS", changed)
    sealed.sealed_templates.cache_clear()
    try:
        with pytest.raises(ValueError, match="not the pinned"):
            sealed.sealed_templates()
    finally:
        sealed.sealed_templates.cache_clear()
