#!/usr/bin/env bash
# The lock service against its backend used directly (docs/benchmarks.md,
# "The lock service: through a replica against direct").
#
#   crates/fencelock-serve/bench/compare.sh [ROUNDS] [SECONDS]
#
# Needs a release build with the bench (`cargo build --release -p
# fencelock-cli --features lab`; another binary via FENCELOCK_BIN) and
# redis-server on PATH. One Redis without persistence and one SQLite file;
# per backend one replica over it, plus one replica over `mem://` (no
# backend I/O at all: what HTTP and the service alone cost, the floor of
# any backend behind a replica on this host). Every scenario runs on every
# side in turn, ROUNDS times; the CPU of each replica and of Redis is read
# from /proc around each run. Prints one JSON line per run, then a table
# of medians and ratios to direct.
set -euo pipefail
rounds=${1:-3}
seconds=${2:-5}
bin=${FENCELOCK_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/fencelock}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p fencelock-cli --features lab" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server is not on PATH" >&2; exit 2; }

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
redis_pid=$!; pids+=("$redis_pid")
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done

declare -A url serve_pid
url[redis]="redis://127.0.0.1:$rport"
url[sqlite]="sqlite://$work/locks.db"
serve() { # name backend-url [flags]
  local port; port=$(free_port)
  "$bin" --url "$2" serve --listen "127.0.0.1:$port" "${@:3}" >"$work/$1.log" 2>&1 &
  serve_pid[$1]=$!; pids+=("$!")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  url[$1]="http://127.0.0.1:$port"
}
serve redis-replica "${url[redis]}"
serve sqlite-replica "${url[sqlite]}"
serve mem-replica mem:// --ephemeral

out="$work/runs.jsonl"
for round in $(seq "$rounds"); do
  for scenario in "cycle 1" "cycle 8" "cycle 32" "handoff 2"; do
    set -- $scenario
    for side in redis redis-replica mem-replica sqlite sqlite-replica; do
      replica=${serve_pid[$side]:-}
      s0=0; [ -n "$replica" ] && s0=$(ticks "$replica")
      r0=$(ticks "$redis_pid")
      result=$("$bin" --json bench --url "${url[$side]}" --scenario "$1" --clients "$2" \
        --duration "${seconds}s" --warmup 500ms 2>/dev/null)
      s1=0; [ -n "$replica" ] && s1=$(ticks "$replica")
      r1=$(ticks "$redis_pid")
      echo "{\"round\":$round,\"side\":\"$side\",\"scenario\":\"$1\",\"clients\":$2,\"replica_ticks\":$((s1 - s0)),\"redis_ticks\":$((r1 - r0)),\"result\":$result}" | tee -a "$out"
    done
  done
done

python3 - "$out" "$(getconf CLK_TCK)" <<'EOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
hz = float(sys.argv[2])
cell = {}
for r in runs:
    f = r["result"]["fencelock"]
    secs = f["seconds"] or 1
    cell.setdefault((r["scenario"], r["clients"], r["side"]), []).append({
        "ops": f["ops_per_sec"], "p50": f["latency_ms"]["p50"],
        "client_us": f.get("client_cpu_us_per_op") or 0,
        # The warm-up's operations are not counted: an over-estimate of
        # the replica's CPU per operation, the same on every side.
        "replica_us": r["replica_ticks"] / hz * 1e6 / max(f["ops"], 1),
    })
med = lambda xs, k: statistics.median(x[k] for x in xs)
print("\n| scenario | side | ops/s | p50 ms | x direct (ops/s; hand-off: p50) | client CPU us/op | replica CPU us/op |")
print("|---|---|---|---|---|---|---|")
for (scenario, clients, side), xs in sorted(cell.items()):
    base = cell.get((scenario, clients, side.split("-")[0] if side != "mem-replica" else "redis"))
    ratio = ""
    if base and side not in ("redis", "sqlite"):
        ratio = "%.2f" % (med(xs, "p50") / med(base, "p50") if scenario == "handoff"
                          else med(xs, "ops") / med(base, "ops"))
    print("| %s %d | %s | %.0f | %.3f | %s | %.0f | %.0f |" % (
        scenario, clients, side, med(xs, "ops"), med(xs, "p50"), ratio,
        med(xs, "client_us"), med(xs, "replica_us")))
EOF
