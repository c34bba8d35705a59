"""Job gates (blobsvc.server._jobgate): writes into a job share its gate, a deletion holds it alone
and goes before writes that arrive after it, and nothing is kept once nobody uses a gate."""

from __future__ import annotations

import asyncio

from blobsvc.server._jobgate import JobGates

JOB, OTHER = b"j" * 16, b"o" * 16


async def test_writes_share_a_gate_and_a_deletion_waits_for_them_all() -> None:
    gates, events = JobGates(), []

    async def write(name: str, seconds: float) -> None:
        async with gates.writing(JOB):
            events.append(f"{name} in")
            await asyncio.sleep(seconds)
            events.append(f"{name} out")

    async def delete() -> None:
        await asyncio.sleep(0.01)
        async with gates.deleting(JOB):
            events.append("delete")

    await asyncio.gather(write("a", 0.05), write("b", 0.03), delete())
    assert events == ["a in", "b in", "b out", "a out", "delete"]
    assert len(gates) == 0


async def test_a_waiting_deletion_goes_before_writes_that_arrive_after_it() -> None:
    gates, events = JobGates(), []

    async def write(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        async with gates.writing(JOB):
            events.append(name)
            await asyncio.sleep(0.03)

    async def delete() -> None:
        await asyncio.sleep(0.01)
        async with gates.deleting(JOB):
            events.append("delete")

    await asyncio.gather(write("first", 0), delete(), write("later", 0.02))
    assert events == ["first", "delete", "later"]


async def test_a_deletion_given_up_lets_the_writes_held_back_for_it_go() -> None:
    gates, events = JobGates(), []

    async def held_back_write() -> None:
        async with gates.writing(JOB):
            events.append("held back write")

    async with gates.writing(JOB):
        deletion = asyncio.create_task(gates.deleting(JOB).__aenter__())
        await asyncio.sleep(0.01)
        write = asyncio.create_task(held_back_write())
        await asyncio.sleep(0.01)
        assert events == [], "a write waits behind a waiting deletion"
        deletion.cancel()
        await asyncio.wait_for(write, 1)
        assert events == ["held back write"]
    assert len(gates) == 0


async def test_other_jobs_never_wait() -> None:
    gates = JobGates()
    async with gates.deleting(JOB), asyncio.timeout(1), gates.writing(OTHER), gates.deleting(b"x" * 16):
        assert len(gates) == 3
    assert len(gates) == 0
