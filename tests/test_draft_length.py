"""The draft-length rule (core/methods/draft_length.py) on scripted rounds: k shrinks and drafting
stops when acceptance falls, grows one per round up to the maximum when it is high, stays off where
the measured step costs say drafting cannot pay, and a seeded run ignores the clock."""

from __future__ import annotations

from specfill.core.methods.draft_length import PROBE_AFTER, DraftLength


def verify_cost(tokens: int) -> float:
    """A main-model pass over `tokens` tokens (seconds): nearly flat, as on a GPU or in bf16."""
    return 0.1 + 0.01 * (tokens - 1)


def play(length: DraftLength, accepts, rounds: int, draft_step: float = 0.02, verify=verify_cost) -> list[int]:
    """Run `rounds` rounds; accepts(k) is how many of k drafts the scripted main model keeps."""
    for _ in range(rounds):
        k = length.next(room=100)
        length.record(k, accepts(k), draft_step * k, verify(k + 1))
    return length.trajectory


def everything(k: int) -> int:
    return k


def nothing(k: int) -> int:
    return 0


def test_a_plain_step_first_then_the_maximum_and_it_stays_while_everything_is_accepted():
    assert play(DraftLength(4), everything, 8) == [0, 4, 4, 4, 4, 4, 4, 4]


def test_falling_acceptance_shrinks_k_then_stops_drafting_with_growing_waits_between_tries():
    length = DraftLength(4)
    play(length, everything, 4)
    trajectory = play(length, nothing, 40)[4:]
    first_stop = trajectory.index(0)
    assert trajectory[0] == 4 and 1 < first_stop <= 6 and min(trajectory[:first_stop]) < 4
    assert trajectory[:first_stop] == sorted(trajectory[:first_stop], reverse=True)
    tries = [i for i, k in enumerate(trajectory) if i > first_stop and k > 0]
    assert all(trajectory[i] == 1 for i in tries) and len(tries) >= 2
    waits = [b - a - 1 for a, b in zip([first_stop - 1] + tries, tries)]
    assert waits[0] >= PROBE_AFTER and all(later > earlier for earlier, later in zip(waits, waits[1:]))
    assert length.acceptance < 0.2


def test_high_acceptance_grows_k_one_per_round_up_to_the_maximum():
    length = DraftLength(5)
    play(length, nothing, 12)
    assert length.trajectory[-1] == 0
    trajectory = play(length, everything, 30)[12:]
    start = trajectory.index(1)  # the try after the plain rounds
    growing = trajectory[start:]
    assert all(0 <= b - a <= 1 for a, b in zip(growing, growing[1:]))  # never down, one up at most
    assert growing.index(5) <= 8 and growing[-1] == 5 and max(trajectory) == 5


def test_moderate_acceptance_settles_between():
    """Every other draft rejected (acceptance ~0.5): drafting pays, but not at the maximum k."""
    trajectory = play(DraftLength(6), lambda k: min(k, 1), 40)
    assert 1 <= trajectory[-1] < 6 and min(trajectory[5:]) >= 1


def test_cost_rule_no_drafting_where_even_full_acceptance_cannot_pay():
    """A draft step as dear as a plain step and a verify pass growing with its tokens: k + 1
    tokens cost more than k + 1 plain steps, so the rule stops after the first drafting round,
    although every draft is accepted; tries later stay single drafts and go back to plain."""
    length = DraftLength(4)
    trajectory = play(length, everything, 30, draft_step=0.1, verify=lambda t: 0.1 * t)
    assert trajectory[:3] == [0, 4, 0] and set(trajectory[3:]) <= {0, 1} and trajectory.count(1) <= 3
    assert length.acceptance > 0.9


def test_the_same_acceptance_drafts_where_the_draft_is_cheap():
    trajectory = play(DraftLength(4), everything, 10, draft_step=0.01)
    assert trajectory == [0] + [4] * 9


def test_room_caps_k_and_the_fixed_schedule_ignores_everything():
    length = DraftLength(4)
    assert length.next(room=10) == 0
    length.record(0, 0, 0.0, 0.1)
    assert length.next(room=2) == 2
    fixed = DraftLength(3, adaptive=False)
    assert play(fixed, nothing, 6, draft_step=1.0) == [3] * 6


def test_a_seeded_run_ignores_the_clock():
    """timed False: k depends on the acceptance only, whatever the measured times."""
    quick = play(DraftLength(4, timed=False), lambda k: min(k, 2), 20)
    slow = play(DraftLength(4, timed=False), lambda k: min(k, 2), 20, draft_step=5.0, verify=lambda t: 9.0 * t)
    assert quick == slow and max(quick[2:]) < 4
