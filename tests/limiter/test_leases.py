from __future__ import annotations

from limiter import LeaseSet


def test_lease_lapses_after_its_ttl_unless_renewed() -> None:
    leases = LeaseSet()
    leases.acquire("a", now=0.0, ttl=10.0)
    leases.acquire("b", now=0.0, ttl=10.0)
    assert leases.renew("b", now=9.0, ttl=10.0)
    assert leases.live(9.9) == 2
    assert leases.live(10.0) == 1
    assert leases.live(18.9) == 1 and leases.live(19.0) == 0


def test_release_frees_the_slot_and_is_idempotent() -> None:
    leases = LeaseSet()
    leases.acquire("a", now=0.0, ttl=10.0)
    assert leases.release("a")
    assert not leases.release("a")
    assert not leases.renew("a", now=1.0, ttl=10.0)
    assert leases.live(1.0) == 0


def test_many_renewals_keep_counting_right() -> None:
    leases = LeaseSet()
    for member in range(50):
        leases.acquire(str(member), now=0.0, ttl=1.0)
    for tick in range(1, 200):
        for member in range(25):
            leases.renew(str(member), now=tick * 0.5, ttl=1.0)
    assert leases.live(99.6) == 25
    assert leases.live(200.0) == 0
