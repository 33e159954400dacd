package fencelock

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
	"testing"
	"time"
)

// Benchmarks through a `fencelock serve` over SQLite started from the
// cargo-built binary (as the tests):
//
//	go test -run '^$' -bench . -benchtime 3s
//
// BenchmarkRustCycle and BenchmarkRustHandoff run the Rust http:// client
// (`fencelock bench`) against the same kind of service in the same run.

// One uncontended TryAcquire + Release.
func BenchmarkCycle(b *testing.B) {
	s := startService(b, "sqlite", false)
	c := newClient(b, s.url)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := c.TryAcquire(ctx, "bench/cycle", TTL(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// Two clients alternate on one key, each waiting in Acquire while the
// other holds it; hand-off = the holder's Release call to the waiter's
// grant.
func BenchmarkHandoff(b *testing.B) {
	s := startService(b, "sqlite", false)
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
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// Memory per held lock: 10,000 locks held (and renewed) by one client.
func BenchmarkHold10000(b *testing.B) {
	s := startService(b, "sqlite", false)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		c := newClient(b, s.url)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		locks := make([]*Lock, 0, 10000)
		for k := 0; k < 10000; k++ {
			l, err := c.TryAcquire(ctx, fmt.Sprintf("bench/hold/%d", k), TTL(5*time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			locks = append(locks, l)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(len(locks)), "heap-B/lock")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
		_ = c.Close()
	}
}

// The Rust http:// client's figures for the same scenarios
// (`fencelock bench --url http://…`), for comparison.
func BenchmarkRustCycle(b *testing.B)   { rustBench(b, "cycle") }
func BenchmarkRustHandoff(b *testing.B) { rustBench(b, "handoff") }

func rustBench(b *testing.B, scenario string) {
	s := startService(b, "sqlite", false)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		code, out := cli(b, nil, "bench", "--scenario", scenario, "--url", s.url, "--duration", "3s", "--json")
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
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			b.Fatal(err, out)
		}
		b.ReportMetric(r.Fencelock.OpsPerSec, "ops/s")
		b.ReportMetric(r.Fencelock.Latency.P50, "p50-ms")
		b.ReportMetric(r.Fencelock.Latency.P99, "p99-ms")
	}
}
