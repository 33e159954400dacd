#!/usr/bin/env python3
"""How much one client token's burst of single-key requests delays another's.

One client token (heavy) acquires and releases keys of its own from PARALLEL
connections at once (processes of 16 connections each, so that the light
client does not wait for Python's GIL); another (light) acquires and
releases one key in a loop. Prints the light client's latency, the heavy
client's rate and the service's CPU per request (docs/http.md, "A client's
share of the backend").

usage: serve-burst.py BINARY URL PARALLEL SECONDS [SERVE FLAGS...]
  URL may contain DIR, replaced by a fresh temporary directory:
  scripts/serve-burst.py target/debug/fencelock sqlite://DIR/l.db 128 15
"""
import http.client
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

HEAVY = "heavy-" + "0" * 24
LIGHT = "light-" + "0" * 24


def call(conn, token, path, body):
    conn.request("POST", path, json.dumps(body),
                 {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.read()


def cycle(conn, token, key, owner):
    status, body = call(conn, token, f"/v1/locks/{key}/acquire", {"ttl_ms": 30000, "owner": owner})
    if status == 200:
        grant = json.loads(body)
        call(conn, token, f"/v1/locks/{key}/release", {"owner": owner, "token": grant["token"]})
    return status


def heavy(port, first, last, stop, out):
    done = [0]

    def connection(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        n = 0
        while time.time() < stop:
            cycle(conn, HEAVY, f"h{i}-{n % 50}", f"o{i}")
            n += 1
            done[0] += 1

    threads = [threading.Thread(target=connection, args=(i,)) for i in range(first, last)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(done[0])


def main():
    binary, url, parallel, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    flags = sys.argv[5:]
    work = tempfile.mkdtemp()
    tokens = os.path.join(work, "tokens")
    with open(tokens, "w") as f:
        f.write(f"client {HEAVY} heavy\nclient {LIGHT} light\n")
    os.chmod(tokens, 0o600)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen(
        [binary, "--url", url.replace("DIR", work), "serve", "--listen", f"127.0.0.1:{port}",
         "--token-file", tokens] + flags,
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "serve.log"), "w"))
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit("the service did not start; see " + os.path.join(work, "serve.log"))

    stop = time.time() + seconds
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=heavy, args=(port, lo, min(parallel, lo + 16), stop, out))
             for lo in range(0, parallel, 16)]
    for p in procs:
        p.start()
    time.sleep(min(1.0, seconds / 5))  # let the burst build up before measuring under it
    latencies = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.time() < stop:
        started = time.perf_counter()
        status = cycle(conn, LIGHT, "light", "me")
        if status != 200:
            sys.exit(f"the light client's acquire answered {status}")
        latencies.append((time.perf_counter() - started) * 1000)
    cycles = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    with open(f"/proc/{server.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    server.terminate()
    server.wait()
    latencies.sort()

    def q(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    requests = 2 * (cycles + len(latencies))
    print(f"{' '.join(flags) or 'default'} parallel={parallel} light n={len(latencies)} "
          f"p50={q(0.5):.1f}ms p99={q(0.99):.1f}ms max={latencies[-1]:.1f}ms "
          f"heavy={cycles / seconds:.0f} cycles/s serve_cpu={cpu * 1e6 / max(1, requests):.0f}us/request")


if __name__ == "__main__":
    main()
