"""A cron job: synchronous code, the lease renewed on the library's own threads."""

from __future__ import annotations

import sys
import time

import fencelock


def main(url: str) -> int:
    client = fencelock.connect_sync(url)
    try:
        with client.lock("cron:cleanup", ttl=10.0, wait=0) as guard:
            for _ in range(3):
                guard.check()  # before each critical write
                time.sleep(0.1)
            return guard.token
    except fencelock.NotAcquired:
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite://locks.db"))
