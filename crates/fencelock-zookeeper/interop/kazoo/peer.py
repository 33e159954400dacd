"""A kazoo client driven line by line on stdin, answering on stdout, for
the interoperability tests of fencelock's ``?layout=curator``
(crates/fencelock-zookeeper/tests/it/interop.rs).

Arguments: the connect string and the session timeout in milliseconds.
Commands: ``lock NAME PATH`` (a kazoo ``Lock`` on PATH that also counts
Curator's ``-lock-`` nodes, as fencelock's are named, acquired in a thread
of its own; answers ``NAME acquired``) and ``unlock NAME`` (``NAME
released``). ``ready`` is printed once connected.
"""

import sys
import threading

from kazoo.client import KazooClient

_say_lock = threading.Lock()


def say(line):
    with _say_lock:
        print(line, flush=True)


def main():
    if len(sys.argv) != 3:
        print("usage: peer.py CONNECT_STRING SESSION_TIMEOUT_MS", file=sys.stderr)
        return 2
    client = KazooClient(hosts=sys.argv[1], timeout=int(sys.argv[2]) / 1000)
    client.start(timeout=20)
    say("ready")
    locks = {}
    for line in sys.stdin:
        words = line.split()
        if words[0] == "lock":
            name, path = words[1], words[2]
            lock = client.Lock(path, identifier=name, extra_lock_patterns=["-lock-"])
            locks[name] = lock

            def hold(name=name, lock=lock):
                lock.acquire()
                say(f"{name} acquired")

            threading.Thread(target=hold, daemon=True).start()
        elif words[0] == "unlock":
            locks.pop(words[1]).release()
            say(f"{words[1]} released")
        else:
            print(f"unknown command: {line}", file=sys.stderr)
            return 2
    client.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
