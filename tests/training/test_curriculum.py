"""The pass-rate curriculum: the reference worker's pre-pass and the order of the steps."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from conductor_pipeline.training.configs import CurriculumSettings, TrainingConfig
from conductor_pipeline.training.curriculum import curriculum_order, reference_pass
from conductor_pipeline.training.rewards import ConductorReward
from conductor_pipeline.workflow.config import prompt_config

from .fakes import FakePool, make_task

DOMAINS = ["math", "logic", "code", "algorithmic"]


def _rows(n_per_domain: int = 10) -> list[dict]:
    return [{"id": f"{d}-{i}", "domain": d} for d in DOMAINS for i in range(n_per_domain)]


def _order(rows, unsolved, share=0.5, balanced=True, seed=0):
    return curriculum_order(
        rows,
        unsolved,
        CurriculumSettings(reference_worker="sim-good", unsolved_share=share),
        prompts_per_step=4,
        balanced_domains=balanced,
        seed=seed,
        steps=10,
    )


def test_each_step_holds_its_share_of_unsolved_questions_and_every_domain():
    rows = _rows()
    unsolved = {f"{d}-{i}" for d in DOMAINS for i in range(4)}  # 16 of 40
    ordered = _order(rows, unsolved)
    assert sorted(r["id"] for r in ordered) == sorted(r["id"] for r in rows)  # a reordering
    steps = [ordered[i : i + 4] for i in range(0, 32, 4)]  # 8 steps use the 16 unsolved
    assert all({r["domain"] for r in step} == set(DOMAINS) for step in steps)
    assert [sum(r["id"] in unsolved for r in step) for step in steps] == [2] * 8
    # the unsolved slots move on, so every domain gets its 4 unsolved questions in 8 steps
    per_domain = Counter(r["domain"] for step in steps for r in step if r["id"] in unsolved)
    assert per_domain == dict.fromkeys(DOMAINS, 4)
    assert not any(r["id"] in unsolved for r in ordered[32:])  # then the rest
    assert [r["id"] for r in _order(rows, unsolved)] == [r["id"] for r in ordered]  # seeded
    assert [r["id"] for r in _order(rows, unsolved, seed=1)] != [r["id"] for r in ordered]


@pytest.mark.parametrize(("share", "expected"), [(0.0, 0), (0.25, 1), (0.75, 3), (1.0, 4)])
def test_the_share_sets_how_many_slots_of_a_step_draw_unsolved_questions(share, expected):
    rows = _rows(20)
    unsolved = {r["id"] for r in rows[::2]}  # half of every domain
    ordered = _order(rows, unsolved, share=share, balanced=False)
    first = ordered[:16]  # both kinds last at least 4 steps at any share
    assert [sum(r["id"] in unsolved for r in first[i : i + 4]) for i in (0, 4, 8, 12)] == [
        expected
    ] * 4


def test_a_final_share_moves_each_steps_share_in_a_straight_line_from_the_first():
    rows = _rows(20)
    unsolved = {r["id"] for r in rows[::2]}  # half of every domain
    settings = CurriculumSettings(
        reference_worker="sim-good", unsolved_share=0.0, final_unsolved_share=1.0
    )
    assert [settings.share_at(step, 5) for step in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    ordered = curriculum_order(
        rows, unsolved, settings, prompts_per_step=4, balanced_domains=False, seed=0, steps=5
    )
    counts = [sum(r["id"] in unsolved for r in ordered[i : i + 4]) for i in range(0, 24, 4)]
    assert counts == [0, 1, 2, 3, 4, 4]  # and the last step's share after it
    assert sorted(r["id"] for r in ordered) == sorted(r["id"] for r in rows)
    constant = replace(settings, final_unsolved_share=None)
    assert {constant.share_at(step, 5) for step in range(6)} == {0.0}


def test_a_domain_without_unsolved_questions_gives_solved_ones():
    rows = _rows(4)
    unsolved = {"math-0", "math-1", "math-2", "math-3"}
    ordered = _order(rows, unsolved)
    assert len(ordered) == len(rows)
    assert {r["domain"] for r in ordered[:4]} == set(DOMAINS)


def _reward(pool: FakePool) -> ConductorReward:
    config = TrainingConfig.from_params({"reward": {"retry_delay_s": 0.0, "infra_retries": 0}})
    return ConductorReward(
        pool, pool.names, pool.descriptions, prompt_config({"few_shot": []}), config.reward
    )


class HalfRightPool(FakePool):
    """``sim-good`` answers the even-numbered questions right and the others wrong."""

    async def __call__(self, worker, messages, sample_index=0, **overrides):
        reply = await super().__call__(worker, messages, sample_index, **overrides)
        text = "\n".join(m["content"] for m in messages)
        odd = any(t.question in text for t in self.tasks if int(t.id[1:]) % 2)
        if worker == 0 and odd and reply.text:
            return replace(reply, text=reply.text.replace("The answer is", "The answer is 1"))
        return reply


def test_the_pre_pass_scores_the_reference_worker_alone_and_keeps_its_verdicts(tmp_path):
    tasks = [make_task(i, i, 10) for i in range(6)]
    pool = HalfRightPool(tasks)
    saved = tmp_path / "curriculum.json"
    passed = reference_pass(tasks, _reward(pool), "sim-good", saved=saved)
    assert passed.verdicts == {f"t{i}": i % 2 == 0 for i in range(6)}
    assert passed.unsolved == {"t1", "t3", "t5"}
    assert passed.report() == {
        "curriculum_reference": "sim-good",
        "curriculum_right": 3,
        "curriculum_wrong": 3,
        "curriculum_unscored": 0,
    }
    assert pool.calls == Counter({0: 6})  # one call per question, to that worker only
    assert json.loads(saved.read_text())["verdicts"]["t1"] is False
    # a resumed run reads the verdicts instead of asking again
    again = reference_pass(tasks, _reward(pool), "sim-good", saved=saved)
    assert again.verdicts == passed.verdicts and pool.calls == Counter({0: 6})
    # another reference worker is asked anew
    assert reference_pass(tasks, _reward(pool), "sim-bad", saved=saved).unsolved == {
        t.id for t in tasks
    }


def test_a_damaged_verdicts_file_is_asked_again_and_rewritten(tmp_path, caplog):
    tasks = [make_task(i) for i in range(2)]
    pool = FakePool(tasks)
    saved = tmp_path / "curriculum.json"
    saved.write_text('{"worker": "sim-good", "verdi')  # cut off mid-write
    with caplog.at_level("WARNING"):
        passed = reference_pass(tasks, _reward(pool), "sim-good", saved=saved)
    assert passed.verdicts == {"t0": True, "t1": True} and pool.calls == Counter({0: 2})
    assert "does not read as a reference pass" in caplog.text
    assert json.loads(saved.read_text())["verdicts"] == passed.verdicts


def test_a_failed_reference_call_is_unscored_not_wrong():
    tasks = [make_task(i) for i in range(3)]
    passed = reference_pass(tasks, _reward(FakePool(tasks)), "sim-broken")
    assert passed.verdicts == dict.fromkeys(["t0", "t1", "t2"])
    assert passed.unsolved == set() and passed.report()["curriculum_unscored"] == 3


def test_a_reference_worker_outside_the_pool_is_refused_by_name():
    tasks = [make_task()]
    with pytest.raises(ValueError, match=r"curriculum.reference_worker: 'sim-sage' is not in"):
        reference_pass(tasks, _reward(FakePool(tasks)), "sim-sage")


def test_the_settings_are_checked_and_turn_off_the_trainers_shuffle():
    from conductor_pipeline.training.trainer_args import grpo_args

    with pytest.raises(ValueError, match=r"training.curriculum.unsolved_share"):
        TrainingConfig.from_params({"curriculum": {"unsolved_share": 1.5}})
    with pytest.raises(ValueError, match=r"training.curriculum.final_unsolved_share"):
        TrainingConfig.from_params({"curriculum": {"final_unsolved_share": -0.1}})
    config = TrainingConfig.from_params({"curriculum": {"reference_worker": "sim-sage"}})
    assert grpo_args(config, "/tmp/unused", use_cpu=True).shuffle_dataset is False
