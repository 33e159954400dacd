package fencelock

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"testing"
	"time"
)

// Benchmarks through a `fencelock serve` started from the cargo-built
// binary (as the tests; FENCELOCK_BIN picks a release build):
//
//	go test -run '^$' -bench . -benchtime 3s
//
// The BenchmarkRust… ones run the Rust http:// client (`fencelock bench`,
// the same binary) against the same kind of service in the same run.
// Cycle and hand-off run over SQLite, where the service's transactions
// dominate, and over Redis, where the clients' own cost shows.
// docs/go.md#performance has the commands.

// benchBackends are the services' backends the cycle and hand-off
// benchmarks run over, one sub-benchmark each.
var benchBackends = []string{"sqlite", "redis"}

func overBackends(b *testing.B, bench func(b *testing.B, backend string)) {
	for _, backend := range benchBackends {
		b.Run(backend, func(b *testing.B) { bench(b, backend) })
	}
}

// One uncontended TryAcquire + Release. The latency percentiles, as the
// Rust client's bench reports them, say more than the rate on a machine
// shared with other work, whose stalls pull the mean down.
func BenchmarkCycle(b *testing.B) { overBackends(b, benchCycle) }

func benchCycle(b *testing.B, backend string) {
	s := startService(b, backend, false)
	c := newClient(b, s.url)
	ctx := context.Background()
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		l, err := c.TryAcquire(ctx, "bench/cycle", TTL(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	reportLatency(b, lat)
}

// reportLatency reports the median and 99th percentile of lat, in ms.
func reportLatency(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// Two clients alternate on one key, each waiting in Acquire while the
// other holds it; hand-off = the holder's Release call to the waiter's
// grant.
func BenchmarkHandoff(b *testing.B) { overBackends(b, benchHandoff) }

func benchHandoff(b *testing.B, backend string) {
	s := startService(b, backend, false)
	clients := [2]*Client{newClient(b, s.url), newClient(b, s.url)}
	ctx := context.Background()
	type grant struct {
		at time.Time
		l  *Lock
	}
	granted := [2]chan grant{make(chan grant), make(chan grant)}
	waiting := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	for w := 0; w < 2; w++ {
		go func(w int) {
			for range waiting[w] {
				l, err := clients[w].Acquire(ctx, "bench/handoff", TTL(30*time.Second), Wait(10*time.Second))
				if err != nil {
					b.Error(err)
					granted[w] <- grant{}
					continue
				}
				granted[w] <- grant{time.Now(), l}
			}
		}(w)
	}
	defer close(waiting[0])
	defer close(waiting[1])
	first, err := clients[0].Acquire(ctx, "bench/handoff", TTL(30*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	held, holder := first, 0
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		next := 1 - holder
		waiting[next] <- struct{}{}
		time.Sleep(time.Millisecond) // let the waiter find the key held
		released := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-granted[next]
		if g.l == nil {
			b.FailNow()
		}
		lat = append(lat, g.at.Sub(released))
		held, holder = g.l, next
	}
	b.StopTimer()
	_ = held.Release(ctx)
	reportLatency(b, lat)
}

// Memory per held lock: 10,000 locks held by one client, read once every
// lock has been renewed (so its renewal state is counted, as the Rust
// client's `hold` scenario does): live heap after a GC and resident memory
// (Linux), each the growth over the client before it took a lock.
func BenchmarkHold10000(b *testing.B) {
	const ttl = 30 * time.Second
	s := startService(b, "sqlite", false)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		c := newClient(b, s.url)
		// Warm the connection and the allocator before the baseline.
		if l, err := c.TryAcquire(ctx, "bench/hold/warm", TTL(ttl)); err != nil {
			b.Fatal(err)
		} else if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rssBefore := rss()
		locks := make([]*Lock, 0, 10000)
		granted := make([]time.Time, 0, 10000)
		for k := 0; k < 10000; k++ {
			l, err := c.TryAcquire(ctx, fmt.Sprintf("bench/hold/%d", k), TTL(ttl))
			if err != nil {
				b.Fatal(err)
			}
			locks = append(locks, l)
			granted = append(granted, l.Deadline())
		}
		renewedAll := time.Now().Add(ttl)
		for k := 0; k < len(locks) && time.Now().Before(renewedAll); {
			if locks[k].Deadline().After(granted[k]) {
				k++
				continue
			}
			time.Sleep(100 * time.Millisecond)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		rssHeld := rss()
		n := float64(len(locks))
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n, "heap-B/lock")
		if rssBefore > 0 && rssHeld > 0 {
			b.ReportMetric(float64(rssHeld-rssBefore)/n, "rss-B/lock")
		}
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		for _, l := range locks {
			if !l.Valid() {
				b.Fatalf("%v was lost while held", l)
			}
		}
		_ = c.Close()
	}
}

// rss is this process's resident memory in bytes (0 where /proc is not).
func rss() int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(data), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize())
}

// The Rust http:// client's figures for the same scenarios
// (`fencelock bench --url http://…`), for comparison.
func BenchmarkRustCycle(b *testing.B) {
	overBackends(b, func(b *testing.B, backend string) {
		rustBench(b, backend, "cycle", "--duration", "3s")
	})
}

func BenchmarkRustHandoff(b *testing.B) {
	overBackends(b, func(b *testing.B, backend string) {
		rustBench(b, backend, "handoff", "--duration", "3s")
	})
}

// BenchmarkRustHold10000 is BenchmarkHold10000's counterpart: one Rust
// client holding 10,000 renewed locks (`fencelock bench --scenario hold`,
// which reads its resident memory once every lock was renewed).
func BenchmarkRustHold10000(b *testing.B) {
	rustBench(b, "sqlite", "hold", "--keys", "10000", "--clients", "1", "--ttl", "30s", "--duration", "2s")
}

func rustBench(b *testing.B, backend, scenario string, extra ...string) {
	s := startService(b, backend, false)
	args := append([]string{"bench", "--scenario", scenario, "--url", s.url, "--json"}, extra...)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		code, out := cliWithin(b, 2*time.Minute, nil, args...)
		if code != 0 {
			b.Fatalf("fencelock bench: exit %d %s", code, out)
		}
		var r struct {
			Fencelock struct {
				OpsPerSec float64 `json:"ops_per_sec"`
				Latency   struct {
					P50 float64 `json:"p50"`
					P99 float64 `json:"p99"`
				} `json:"latency_ms"`
			} `json:"fencelock"`
			Hold *struct {
				Locks        int     `json:"locks"`
				BytesPerLock float64 `json:"bytes_per_lock"`
			} `json:"hold"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			b.Fatal(err, out)
		}
		if r.Hold != nil {
			b.ReportMetric(r.Hold.BytesPerLock, "rss-B/lock")
			continue
		}
		b.ReportMetric(r.Fencelock.OpsPerSec, "ops/s")
		b.ReportMetric(r.Fencelock.Latency.P50, "p50-ms")
		b.ReportMetric(r.Fencelock.Latency.P99, "p99-ms")
	}
}
