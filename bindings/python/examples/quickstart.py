"""The README's example: one job at a time across every process on a backend."""

from __future__ import annotations

import asyncio
import sys

import fencelock


async def main(url: str) -> None:
    client = await fencelock.connect(url)
    try:
        guard = await client.acquire("nightly-report", ttl=30.0, wait=0)
    except fencelock.NotAcquired as e:
        print(f"another process runs it ({e.code})")
        return
    print(f"holding {guard.key} as {guard.owner}, token {guard.token}")
    # Present guard.token to the protected resource with every write.
    await guard.release()

    # Or: released on exit, and the work cancelled if the lock is lost.
    async def report(guard: fencelock.Guard) -> int:
        guard.check()
        return guard.token

    token = await client.run("nightly-report", report, ttl=30.0)
    print(f"ran with token {token}")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite://locks.db"))
