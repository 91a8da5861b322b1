"""Attach tokens in the session hub: single use, capped per session, gone once expired."""

from metis.core.events.hub import SessionHub


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hub_with_clock(
    token_ttl_s: float = 60.0, tokens_per_session: int = 100
) -> tuple[SessionHub, Clock]:
    clock = Clock()
    hub = SessionHub(token_ttl_s=token_ttl_s, tokens_per_session=tokens_per_session)
    hub.clock = clock
    return hub, clock


def test_a_token_opens_its_own_session_once() -> None:
    hub, _ = hub_with_clock()
    token, ttl_s = hub.mint_token("s1")
    assert ttl_s == 60.0
    assert hub.check_token(token, "s2") == "wrong_session"
    assert hub.check_token(token, "s1") == "ok"
    assert hub.check_token(token, "s1") == "invalid"
    assert not hub.holds("s1")


def test_past_the_cap_a_sessions_oldest_tokens_stop_working() -> None:
    hub, _ = hub_with_clock(tokens_per_session=3)
    tokens = [hub.mint_token("s1")[0] for _ in range(5)]
    other = hub.mint_token("s2")[0]
    assert hub.token_count("s1") == 3
    assert [hub.check_token(t, "s1") for t in tokens] == ["invalid"] * 2 + ["ok"] * 3
    assert hub.check_token(other, "s2") == "ok"


def test_expired_tokens_leave_memory_in_minting_order() -> None:
    hub, clock = hub_with_clock(token_ttl_s=10.0)
    early = hub.mint_token("s1")[0]
    clock.now += 6
    late = hub.mint_token("s2")[0]
    used = hub.mint_token("s2")[0]
    assert hub.check_token(used, "s2") == "ok"
    clock.now += 5  # the first has expired, the others not
    assert hub.token_count() == 1
    assert not hub.holds("s1")
    assert hub.check_token(early, "s1") == "invalid"
    clock.now += 6
    assert hub.check_token(late, "s2") == "invalid"
    assert hub.token_count() == 0 and not hub.holds("s2")


def test_revoking_a_sessions_tokens_spares_the_others() -> None:
    hub, _ = hub_with_clock()
    mine = [hub.mint_token("s1")[0] for _ in range(3)]
    theirs = hub.mint_token("s2")[0]
    hub.revoke_tokens("s1")
    assert not hub.holds("s1")
    assert all(hub.check_token(t, "s1") == "invalid" for t in mine)
    assert hub.check_token(theirs, "s2") == "ok"
