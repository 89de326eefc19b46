"""FairGate: a tenant alone gets every worker; waiting tenants are served fewest-held first."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.fairness import FairGate, NoSlot

pytestmark = pytest.mark.anyio


async def test_a_tenant_alone_gets_every_slot() -> None:
    gate = FairGate(3)
    held = [gate.slot("a") for _ in range(3)]
    for slot in held:
        await slot.__aenter__()
    assert gate.held == {"a": 3}
    for slot in held:
        await slot.__aexit__(None, None, None)
    assert gate.held == {} and gate.waiting == {}


async def _queue(gate: FairGate, first: int) -> tuple[list[str], asyncio.Event, list[asyncio.Task[None]]]:
    """Tenant 'a' asks for ``first`` slots, then 'b' for one; each holds its slot until ``release``
    is set. Returns the order slots were granted in, the release, and the tasks."""
    order: list[str] = []
    release = asyncio.Event()

    async def work(tenant: str, name: str) -> None:
        async with gate.slot(tenant):
            order.append(name)
            await release.wait()

    tasks = [asyncio.create_task(work("a", f"a{i}")) for i in range(first)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(work("b", "b0")))
    await asyncio.sleep(0.01)
    return order, release, tasks


async def test_a_freed_slot_goes_to_the_waiting_tenant_holding_fewest() -> None:
    gate = FairGate(2)
    order, release, tasks = await _queue(gate, 4)
    assert order == ["a0", "a1"] and len(gate.waiting["a"]) == 2 and len(gate.waiting["b"]) == 1
    release.set()
    await asyncio.gather(*tasks)
    assert order[2] == "b0", order  # b held nothing, so it went before a's queued work
    assert gate.held == {} and gate.waiting == {}


async def test_a_share_caps_a_tenant_even_when_nobody_waits() -> None:
    gate = FairGate(4, share=0.5)
    first, second, third = gate.slot("a"), gate.slot("a"), gate.slot("a")
    await first.__aenter__()
    await second.__aenter__()
    blocked = asyncio.create_task(third.__aenter__())
    await asyncio.sleep(0.01)
    assert not blocked.done() and gate.held == {"a": 2}
    async with gate.slot("b"):  # another tenant is not held back by a's cap
        assert gate.held == {"a": 2, "b": 1}
    await first.__aexit__(None, None, None)
    await blocked
    assert gate.held == {"a": 2}
    await second.__aexit__(None, None, None)
    await third.__aexit__(None, None, None)


async def test_a_waiter_that_gives_up_leaves_no_slot_behind() -> None:
    gate = FairGate(1)
    holder = gate.slot("a")
    await holder.__aenter__()
    waiter = asyncio.create_task(gate.slot("b").__aenter__())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await holder.__aexit__(None, None, None)
    assert gate.held == {} and gate.waiting == {}
    async with gate.slot("c"):
        assert gate.held == {"c": 1}


async def test_a_waiter_past_its_timeout_gets_no_slot_and_takes_none() -> None:
    gate = FairGate(1)
    async with gate.slot("a"):
        with pytest.raises(NoSlot):
            async with gate.slot("b", timeout=0.05):
                pass
        assert gate.waiting == {}
    assert gate.held == {}


async def test_a_reserve_keeps_a_slot_for_a_tenant_holding_none() -> None:
    gate = FairGate(3, reserve=1)
    release = asyncio.Event()
    started: list[str] = []

    async def work(tenant: str) -> None:
        async with gate.slot(tenant):
            started.append(tenant)
            await release.wait()

    hostile = [asyncio.create_task(work("a")) for _ in range(6)]
    await asyncio.sleep(0.01)
    assert gate.held == {"a": 2} and len(gate.waiting["a"]) == 4  # the third slot is kept back
    victim = asyncio.create_task(work("b"))
    await asyncio.sleep(0.01)
    assert started[-1] == "b" and gate.held == {"a": 2, "b": 1}  # served at once, no call of 'a' ended
    assert gate.reserved_grants == 1
    release.set()
    await asyncio.gather(*hostile, victim)
    assert gate.held == {} and gate.waiting == {}


async def test_a_reserve_never_takes_the_only_slot() -> None:
    gate = FairGate(1, reserve=1)
    async with gate.slot("a", timeout=1):
        assert gate.held == {"a": 1}


async def test_between_tenants_holding_as_many_the_one_served_longest_ago_goes_first() -> None:
    gate = FairGate(1)
    order, release, tasks = await _queue(gate, 3)
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "a1", "a2"]  # 'a' holds none once a0 ends, as 'b' does: 'b' was never served
