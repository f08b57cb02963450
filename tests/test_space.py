"""The search space: every enumerated plan is valid, pins are honoured, rules are applied."""

import pytest

from autoplan import space, space_checks
from hwprofiles.errors import InputError
from simulator.model_files import load_model
from simulator.plan import plan_errors


@pytest.fixture(scope="module")
def gpt():
    return load_model("gpt3-175b")


def test_divisors():
    assert space.divisors(12) == [1, 2, 3, 4, 6, 12]
    assert space.divisors(1) == [1]


def test_every_enumerated_plan_is_valid(gpt):
    plans = space.enumerate_plans(gpt, 64, 128, {})
    assert len(plans) > 1000
    for plan in plans[::37]:
        assert plan_errors(gpt, plan, 64, 128) == [], plan


def test_no_zero_stage_without_effect_unless_pinned(gpt):
    """One rank holding the weights (d*cp = 1) and nothing offloaded: ZeRO 1-3 shard and reduce
    nothing and run as ZeRO 0 does (as fast, as much memory or more), so the search leaves them
    out; offloaded, or pinned with --fix, they stay."""
    plans = space.enumerate_plans(gpt, 64, 128, {})
    alone = [p for p in plans if p.grad_group == 1]
    assert alone and not any(p.zero_without_effect for p in plans)
    assert {p.zero for p in alone if p.offload == "none"} == {0}
    assert {p.zero for p in alone if p.offload == "cpu"} == {1, 2, 3}  # ZeRO-Offload on one rank
    pinned = space.enumerate_plans(gpt, 64, 128, {"zero": 2, "d": 1})
    assert pinned and all(p.zero == 2 and p.zero_without_effect == (p.offload == "none") for p in pinned)


def test_space_rules(gpt):
    plans = space.enumerate_plans(gpt, 64, 128, {})
    assert all(gpt.num_attention_heads % p.t == 0 for p in plans)
    assert all(p.offload != "cpu" or p.zero >= 1 for p in plans)
    assert all(p.offload != "nvme" or p.zero == 3 for p in plans)
    assert all(p.sp == 0 or p.t > 1 for p in plans)
    assert all(p.v == 1 or p.schedule in ("interleaved", "zbv") for p in plans)
    assert {p.schedule for p in plans} == {"1f1b", "gpipe", "interleaved", "zbh1", "zbv"}
    assert all(p.schedule not in ("zbh1", "zbv") or (p.p > 1 and p.zero <= 1) for p in plans)
    assert all(p.schedule != "zbv" or (p.v == 2 and gpt.num_layers % (2 * p.p) == 0) for p in plans)
    assert all(p.mb <= space.MAX_MB for p in plans)


def test_fix_pins_keys(gpt):
    fix = space.parse_fix("t=8,zero=1,ckpt=full")
    plans = space.enumerate_plans(gpt, 64, 128, fix)
    assert plans and all(p.t == 8 and p.zero == 1 and p.ckpt == "full" for p in plans)


def test_fix_bad_key_is_input_error():
    with pytest.raises(InputError, match="unknown key 'q'"):
        space.parse_fix("q=1")


@pytest.mark.parametrize("text", ["p=2,v=1,layers=1/31", "ckpt=full,recompute=16:0/16:0"])
def test_fix_refuses_one_plans_split(text):
    """A layer split or recomputation map is one plan's, chosen per finalist by CP-SAT: --fix refuses
    it (the search had left it out without a word) and says where it is taken."""
    with pytest.raises(InputError, match=r"--fix (layers|recompute)=.*simulate --plan"):
        space.parse_fix(text)


def test_explain_empty_names_the_rule(gpt):
    fix = space.parse_fix("t=5")
    assert space.enumerate_plans(gpt, 64, 128, fix) == []
    msg = space_checks.explain_empty(gpt, 64, 128, fix)
    assert "t" in msg and "--fix" in msg
