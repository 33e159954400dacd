"""Side-by-side benchmark on one throwaway Redis (docs/benchmarks.md,
"Python"): uncontended acquire + release with one client, in alternating
slices, for the binding (async and sync), the Rust library (`fencelock
bench`, release build), redis-py's `Lock` (sync, and its asyncio client's
`Lock`, the like of the binding's async path) and python-redis-lock; then
the binding's hand-off p50 and its memory per held lock at 10,000 locks.

The Rust library's cycle rate comes from `bindings/nodejs/examples/cycle.rs`
when its release build is in the target directory (`cargo build --release
--example cycle` in bindings/nodejs: the same library, one release build
fewer than the CLI with `lab`), else from `fencelock bench`. With the
example it is measured twice: its loop in the main thread's `block_on`
(the reference of the ratios) and as a task on the runtime, its best.

Not a test: it asserts nothing. Run with the release wheel installed:

    python bindings/python/bench/bench.py [--slice 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable, Dict, List

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import fencelock  # noqa: E402
import redis  # noqa: E402
import redis.asyncio  # noqa: E402
import redis_lock  # type: ignore[import-untyped]  # noqa: E402
from servers import TARGET, Server  # noqa: E402

RUST = TARGET / "release" / "fencelock"
CYCLE = TARGET / "release" / "examples" / "cycle"


#: This process's CPU time (every thread: the interpreter's and the
#: extension's runtime) per cycle of the last rate measured in-process; less
#: swayed by a loaded machine than the rate.
CPU_US: List[float] = [float("nan")]


def rate(cycle: Callable[[], None], seconds: float) -> float:
    cpu = time.process_time()
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        cycle()
        done += 1
    CPU_US[0] = (time.process_time() - cpu) * 1e6 / done
    return done / seconds


async def async_rate(cycle: Callable[[], Awaitable[None]], seconds: float) -> float:
    cpu = time.process_time()
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        await cycle()
        done += 1
    CPU_US[0] = (time.process_time() - cpu) * 1e6 / done
    return done / seconds


def rust_bench(url: str, scenario: str, *extra: str) -> Dict[str, Any]:
    out = subprocess.run(
        [str(RUST), "--json", "bench", "--url", url, "--scenario", scenario, *extra],
        capture_output=True, text=True, check=True,
    )
    report: Dict[str, Any] = json.loads(out.stdout)
    return report


def rust_rate(url: str, seconds: float, *mode: str) -> float:
    """The Rust library's rate; `mode` "spawned" runs its loop as a task on
    the runtime (its best) rather than in the main thread's `block_on`."""
    if CYCLE.exists():
        out = subprocess.run([str(CYCLE), url, str(int(seconds * 1000)), *mode],
                             capture_output=True, text=True, check=True)
        return float(out.stdout)
    report = rust_bench(url, "cycle", "--clients", "1", "--duration", f"{seconds}s",
                        "--warmup", "200ms", "--rounds", "1")
    return float(report["fencelock"]["ops_per_sec"])


async def handoff_p50(url: str, rounds: int) -> float:
    a = await fencelock.connect(url)
    b = await fencelock.connect(url)
    samples: List[float] = []
    for _ in range(rounds):
        held = await a.acquire("bench:handoff", ttl=30.0)
        waiter = asyncio.ensure_future(b.acquire("bench:handoff", ttl=30.0, wait=10.0))
        await asyncio.sleep(0.005)
        start = time.perf_counter()
        await held.release()
        got = await waiter
        samples.append(time.perf_counter() - start)
        await got.release()
    await a.close()
    await b.close()
    return statistics.median(samples) * 1000


def server_usec(r: redis.Redis) -> int:
    """The server's own time since the last CONFIG RESETSTAT: the sum of
    INFO commandstats' usec (a script's commands count inside its EVALSHA)."""
    stats: Dict[str, Dict[str, Any]] = r.info("commandstats")
    return sum(int(v["usec"]) for k, v in stats.items()
               if k not in ("cmdstat_info", "cmdstat_config"))


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def memory_per_lock(url: str, count: int) -> float:
    client = await fencelock.connect(url)
    before = rss()
    guards = []
    for start in range(0, count, 100):
        guards.extend(await asyncio.gather(*(client.acquire(f"bench:hold:{i}", ttl=30.0)
                                             for i in range(start, start + 100))))
    await asyncio.sleep(2)
    per_lock = (rss() - before) / count
    await client.close()
    return per_lock


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slice", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    server = Server("redis")
    try:
        host, port = "127.0.0.1", server.port
        r = redis.Redis(host=host, port=port)
        sync_client = fencelock.connect_sync(server.url)

        def binding_sync() -> None:
            sync_client.acquire("bench:sync", ttl=30.0, wait=0).release()

        def redis_py() -> None:
            lock = r.lock("bench:redispy", timeout=30)
            assert lock.acquire(blocking=False)
            lock.release()

        def python_redis_lock() -> None:
            lock = redis_lock.Lock(r, "bench:prl", expire=30)
            assert lock.acquire(blocking=False)
            lock.release()

        loop = asyncio.new_event_loop()
        async_client = loop.run_until_complete(fencelock.connect(server.url))
        ar = redis.asyncio.Redis(host=host, port=port)

        async def binding_async() -> None:
            guard = await async_client.acquire("bench:async", ttl=30.0, wait=0)
            await guard.release()

        async def redis_py_asyncio() -> None:
            lock = ar.lock("bench:redispy-asyncio", timeout=30)
            assert await lock.acquire(blocking=False)
            await lock.release()

        names = ["rust", "rust (spawned task)", "binding async", "binding sync",
                 "redis-py Lock", "redis-py Lock (asyncio)", "python-redis-lock"]
        with_rust = CYCLE.exists() or RUST.exists()
        if not with_rust:
            print(f"{RUST} and {CYCLE} are missing: no Rust rows\n")
            names.remove("rust")
        if not CYCLE.exists():
            # `fencelock bench` has no spawned mode to compare with.
            names.remove("rust (spawned task)")
        rates: Dict[str, List[float]] = {k: [] for k in names}
        runs: Dict[str, Callable[[], float]] = {
            "rust": lambda: rust_rate(server.url, args.slice),
            "rust (spawned task)": lambda: rust_rate(server.url, args.slice, "spawned"),
            "binding async": lambda: loop.run_until_complete(async_rate(binding_async, args.slice)),
            "binding sync": lambda: rate(binding_sync, args.slice),
            "redis-py Lock": lambda: rate(redis_py, args.slice),
            "redis-py Lock (asyncio)": lambda: loop.run_until_complete(
                async_rate(redis_py_asyncio, args.slice)),
            "python-redis-lock": lambda: rate(python_redis_lock, args.slice),
        }
        server_us: Dict[str, List[float]] = {k: [] for k in rates}
        client_us: Dict[str, List[float]] = {k: [] for k in rates}
        for _ in range(args.rounds):
            for name in rates:
                r.config_resetstat()
                CPU_US[0] = float("nan")
                cycles_per_second = runs[name]()
                client_us[name].append(CPU_US[0])
                rates[name].append(cycles_per_second)
                server_us[name].append(server_usec(r) / (cycles_per_second * args.slice))
        base_name = "rust" if with_rust else "binding async"
        base = statistics.median(rates[base_name])
        print(f"| client | cycles/s (median of rounds; range) | / {base_name} (rounds) | server µs/cycle | client CPU µs/cycle |")
        print("|---|---|---|---|---|")
        for name, values in rates.items():
            median = statistics.median(values)
            ratios = [v / b for v, b in zip(values, rates[base_name])]
            print(f"| {name} | {median:,.0f} ({min(values):,.0f}–{max(values):,.0f}) | "
                  f"{median / base:.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
                  f"{statistics.median(server_us[name]):.1f} | {statistics.median(client_us[name]):.1f} |")
        print(f"\nhand-off p50 (binding, async): {loop.run_until_complete(handoff_p50(server.url, 300)):.3f} ms")
        print(f"memory per held lock (binding, 10,000 locks): "
              f"{loop.run_until_complete(memory_per_lock(server.url, 10_000)):,.0f} B")
        if not RUST.exists():
            print(f"{RUST} is missing (cargo build --release -p fencelock-cli --features lab): "
                  "no Rust hand-off and memory rows")
            loop.run_until_complete(async_client.close())
            loop.run_until_complete(ar.aclose())
            sync_client.close()
            return
        handoff = rust_bench(server.url, "handoff", "--duration", "3s", "--warmup", "200ms", "--rounds", "1")
        print(f"hand-off p50 (Rust library): {handoff['fencelock']['latency_ms']['p50']:.3f} ms")
        hold = rust_bench(server.url, "hold", "--keys", "10000", "--ttl", "30s", "--duration", "4s")
        print(f"memory per held lock (Rust library, 10,000 locks): {hold['hold']['bytes_per_lock']:,.0f} B")
        loop.run_until_complete(async_client.close())
        loop.run_until_complete(ar.aclose())
        sync_client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
