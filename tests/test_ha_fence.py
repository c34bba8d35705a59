"""The shared fencing check: concurrent acknowledgements share ZooKeeper round trips, and
none is answered by a check that began before it asked (its data might not have been
durable then). The check here is a plain function: what is tested is the sharing."""

from __future__ import annotations

import asyncio
import threading

from blobsvc.ha.coordinator import _SharedCheck


async def test_callers_share_checks_and_each_gets_one_that_began_after_it_asked() -> None:
    started: list[int] = []
    release, running = threading.Event(), threading.Event()

    def check() -> bool:
        started.append(len(started))
        running.set()
        release.wait(5)
        return True

    shared = _SharedCheck(check)
    first = asyncio.ensure_future(shared.confirm())
    assert await asyncio.to_thread(running.wait, 5)
    # These ask while the first check is in flight: that check must not answer them.
    later = [asyncio.ensure_future(shared.confirm()) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in later)
    release.set()
    assert await first is True
    assert all(await asyncio.gather(*later))
    assert len(started) == 2, "eight waiting callers share the one check that began after them"


async def test_a_failed_check_refuses_everyone_who_shared_it() -> None:
    shared = _SharedCheck(lambda: False)
    assert await asyncio.gather(*(shared.confirm() for _ in range(4))) == [False] * 4
