"""`with attend.policy(...)` is per thread: blocks that overlap in several
threads, nest in one, or end by an exception leave every thread and the
process with exactly the policy they had (issue 41)."""

import contextlib
import threading

import pytest

import attend
import attend.torch as at
from conftest import randn

TIMEOUT = 30


def _run(*targets):
    """Runs each target on its own thread; re-raises the first failure."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001  (re-raised on the main thread)
                errors.append(e)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


def _wait(event):
    assert event.wait(TIMEOUT), "the other thread never got there"


def test_overlapping_blocks_in_two_threads_leave_the_process_policy_as_it_was(restore_policy):
    # A enters, B enters, A exits, B exits: with a save/restore of the
    # process-wide policy, B restored the policy A had set (force="reference",
    # tune_cache "") and the process stayed on it.
    attend.set_policy(tune_cache="off")
    before = attend.get_policy()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with attend.policy(force="reference"):
            a_in.set()
            _wait(b_in)
            seen["a"] = attend.get_policy()
        a_out.set()

    def b():
        _wait(a_in)
        with attend.policy(force="flash", select="autotune"):
            b_in.set()
            _wait(a_out)
            seen["b"] = attend.get_policy()

    def outsider():  # a thread without a block, while both are open
        _wait(b_in)
        seen["outsider"] = attend.get_policy()

    _run(a, b, outsider)
    assert seen["a"]["force"] == "reference" and seen["a"]["select"] == "priority"
    assert seen["b"]["force"] == "flash" and seen["b"]["select"] == "autotune"
    assert seen["outsider"] == before
    after = attend.get_policy()
    assert after == before
    assert after["force"] is None and after["tune_cache"] == "off"


def test_a_block_selects_on_its_own_thread_only(restore_policy):
    q, k, v = (randn(1, 16, 2, 16, seed=s) for s in range(3))
    inside, checked = threading.Event(), threading.Event()
    chosen = {}

    def forced():
        with attend.policy(force="reference"):
            inside.set()
            _wait(checked)
            chosen["forced"] = at.explain(q, k, v, api="flash_attn").selected

    def free():
        _wait(inside)
        chosen["free"] = at.explain(q, k, v, api="flash_attn").selected
        checked.set()

    _run(forced, free)
    assert chosen["forced"] == "reference"
    assert chosen["free"] != "reference"


def test_nested_blocks_restore_each_level(restore_policy):
    before = attend.get_policy()
    with attend.policy(force="reference", tune_cache="off"):
        assert attend.get_policy()["tune_cache"] == "off"
        with attend.policy(disable="reference"):
            p = attend.get_policy()
            assert p["force"] is None and p["disable"] == ["reference"] and p["tune_cache"] == ""
        p = attend.get_policy()
        assert p["force"] == "reference" and p["disable"] == [] and p["tune_cache"] == "off"
    assert attend.get_policy() == before


def test_an_exception_inside_a_block_restores_the_policy(restore_policy):
    before = attend.get_policy()
    with pytest.raises(KeyError):
        with attend.policy(force="reference"):
            raise KeyError("boom")
    assert attend.get_policy() == before
    with pytest.raises(attend.InvalidArgumentError, match="force"):
        with attend.policy(force="nosuch"):
            pass
    assert attend.get_policy() == before


def test_blocks_ending_out_of_order_remove_only_their_own(restore_policy):
    before = attend.get_policy()
    outer, inner = attend.policy(force="reference"), attend.policy(force="flash")
    stack = contextlib.ExitStack()
    outer.__enter__()
    stack.enter_context(inner)
    outer.__exit__(None, None, None)  # the outer block ends first
    assert attend.get_policy()["force"] == "flash"
    stack.close()
    assert attend.get_policy() == before


def test_set_policy_inside_a_block_changes_the_process_policy(restore_policy):
    with attend.policy(force="reference"):
        attend.set_policy(disable="decode")
        assert attend.get_policy()["force"] == "reference"  # the block's, until it ends
    assert attend.get_policy()["disable"] == ["decode"]


def test_tune_cache_off_round_trips(restore_policy):
    attend.set_policy(select="autotune", tune_cache="off")
    assert attend.get_policy()["tune_cache"] == "off"
    with attend.policy(select="autotune", tune_cache="off"):
        assert attend.get_policy()["tune_cache"] == "off"
    assert attend.get_policy()["tune_cache"] == "off"
