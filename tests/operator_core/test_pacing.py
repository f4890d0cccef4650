"""The create pacer (controller/adapters/pacing.py) on its own, with a hand-driven clock: at most
`limit` children untaken, a line that nobody jumps, woken in order as slots free, slots that expire,
and jobs that leave the line without creating."""

from __future__ import annotations

from llmtrain.controller.adapters.pacing import CreatePacer


JA, JB, JC, JD, JE = (("ns", j) for j in "abcde")  # one namespace's jobs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pacer(limit: int = 2, ttl: float = 30.0):
    woken: list = []
    clock = Clock()
    return CreatePacer(limit, wake=woken.append, ttl=ttl, clock=clock), woken, clock


def test_at_most_limit_untaken_children_then_jobs_wait_in_line():
    p, woken, _ = pacer(limit=2)
    assert p.admit(JA, "a-1") and p.admit(JB, "b-1")
    assert not p.admit(JC, "c-1") and not p.admit(JD, "d-1")
    assert p.counts() == (2, 2) and woken == []


def test_a_taken_child_wakes_the_head_of_the_line_and_no_one_jumps_it():
    p, woken, _ = pacer(limit=2)
    p.admit(JA, "a-1"), p.admit(JB, "b-1"), p.admit(JC, "c-1"), p.admit(JD, "d-1")
    p.taken("a-1")
    assert woken == [JC]
    # a newcomer (or d, behind c) does not take the slot c was woken for
    assert not p.admit(JE, "e-1") and not p.admit(JD, "d-1")
    assert p.admit(JC, "c-1")
    assert p.counts() == (2, 2)
    p.taken("b-1"), p.taken("c-1")
    assert woken == [JC, JD, JE]  # in the order they came
    assert p.admit(JE, "e-1") and p.admit(JD, "d-1")  # the two slots are theirs, in either order
    assert p.counts() == (2, 0)


def test_a_job_woken_twice_is_woken_once_until_it_runs():
    p, woken, _ = pacer(limit=1)
    p.admit(JA, "a-1"), p.admit(JB, "b-1")
    p.taken("a-1")
    p.taken("a-1")  # a second event of the same child frees nothing
    assert woken == [JB]


def test_a_job_that_leaves_the_line_makes_room_for_the_next():
    p, woken, _ = pacer(limit=1)
    p.admit(JA, "a-1"), p.admit(JB, "b-1"), p.admit(JC, "c-1")
    p.taken("a-1")
    assert woken == [JB]
    p.leave(JB)  # b's run ended with nothing to create (suspended, deleted, failed meanwhile)
    assert woken == [JB, JC] and p.admit(JC, "c-1")
    p.forget(("ns", "nobody"))  # a job never in line: nothing happens
    assert p.counts() == (1, 0)


def test_a_silent_controller_frees_its_slots_after_the_ttl_and_only_the_head_has_a_timer():
    p, woken, clock = pacer(limit=2, ttl=30.0)
    p.admit(JA, "a-1")
    clock.now += 10
    p.admit(JB, "b-1")
    assert not p.admit(JC, "c-1") and not p.admit(JD, "d-1") and not p.admit(JE, "e-1")
    assert p.recheck_in(JC) == 20.0  # a-1 stops counting then
    assert p.recheck_in(JD) is None and p.recheck_in(JE) is None  # woken as the line moves
    clock.now += 20
    assert p.admit(JC, "c-1")  # the head's timer: a-1 expired
    assert p.counts() == (2, 2) and p.recheck_in(JD) == 10.0  # b-1 next
    clock.now += 10
    # whoever notices b-1's expiry first, the slot is the head's: e (behind d) waits, d is woken
    assert not p.admit(JE, "e-1")
    assert woken == [JD] and p.admit(JD, "d-1")
    assert p.counts() == (2, 1)


def test_a_create_that_did_not_make_it_gives_its_slot_back():
    p, woken, _ = pacer(limit=1)
    assert p.admit(JA, "a-1") and not p.admit(JB, "b-1")
    p.taken("a-1")  # act.create: rejected, adopted or raised
    assert woken == [JB] and p.admit(JB, "b-1")


def test_limit_zero_never_holds():
    p, woken, _ = pacer(limit=0)
    assert all(p.admit(("ns", j), f"{j}-1") for j in "abcdef")
    assert p.counts() == (0, 0) and p.recheck_in(JA) is None


def test_namespaces_take_turns_so_one_tenants_burst_does_not_keep_anothers_job_waiting():
    p, woken, _ = pacer(limit=1)
    burst = [("team-a", f"j{i}") for i in range(5)]
    assert p.admit(burst[0], "a0")
    assert not any(p.admit(j, f"{j[1]}-x") for j in burst[1:])
    late = ("team-b", "one")
    assert not p.admit(late, "b-1")  # held: no slot
    p.taken("a0")
    assert woken == [burst[1]]  # team-a's next came first
    assert p.admit(burst[1], "a1")
    p.taken("a1")
    assert woken == [burst[1], late]  # then team-b's turn, ahead of team-a's other three
    assert not p.admit(burst[2], "a2") and p.admit(late, "b-1")
    p.taken("b-1")
    assert woken[-1] == burst[2] and p.counts() == (0, 3)
