"""Leader election, a fenced write, and loss handling with `async with`."""

from __future__ import annotations

import asyncio
import sys
from typing import Optional

import fencelock


async def main(url: str) -> Optional[int]:
    async with await fencelock.connect(url) as client:
        election = client.election("scheduler")
        leadership = await election.campaign(ttl=15.0, wait=5.0, value={"addr": "10.0.0.7:8080"})
        fence = await fencelock.open_fence(url)
        try:
            await fence.admit("scheduler-state", leadership.term)
        except fencelock.Stale:
            return None
        leader = await election.leader()
        await leadership.resign()
        async with client.lock("orders:42", ttl=5) as guard:
            watcher = asyncio.ensure_future(guard.lost())
            await asyncio.sleep(0.01)
            watcher.cancel()
        return None if leader is None else int(leader["term"])


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite://locks.db")))
