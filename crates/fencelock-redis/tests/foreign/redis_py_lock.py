"""redis-py's `Lock`, driven line by line by tests/foreign_locks.rs.

argv[1]: the Redis URL. Prints `ready VERSION`, then answers each line
`acquire KEY TTL_MS` with `granted` or `held` (one non-blocking try) and
`release KEY` with `released` or `not-held`.
"""

import sys

import redis
from redis.exceptions import LockError

client = redis.Redis.from_url(sys.argv[1])
locks = {}
print("ready", redis.__version__, flush=True)
for line in sys.stdin:
    command, key, *rest = line.split()
    if command == "acquire":
        lock = client.lock(key, timeout=int(rest[0]) / 1000)
        if lock.acquire(blocking=False):
            locks[key] = lock
            print("granted", flush=True)
        else:
            print("held", flush=True)
    elif command == "release":
        lock = locks.pop(key, None)
        try:
            if lock is None:
                raise LockError("not acquired here")
            lock.release()
            print("released", flush=True)
        except LockError:
            print("not-held", flush=True)
    else:
        print("unknown command", command, flush=True)
