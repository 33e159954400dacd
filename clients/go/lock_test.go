package fencelock

// Time: (b) every TTL, wait, hold and bound is a base figure scaled by the
// test's measured patience (patience_test.go): a scaled TTL comes with a
// hold scaled alike, so a hold still spans as many renewal periods. A
// waiter is waited for where it waits (its event stream, the service's
// count of long polls), not given a sleep to get there. The renewal
// requests counted are those of the hold alone, whatever the machine's
// speed while the locks were taken.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var backends = []string{"sqlite", "redis"}

var acquiredRe = regexp.MustCompile(` token=(\d+) owner=(\S+)`)

// Exclusion and growing tokens between this module and the Rust CLI
// (the http:// backend) on one key, in both directions.
func TestExclusionAndTokensWithTheRustCLI(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			pat := measurePatience()
			s := startService(t, backend, false)
			c := newClient(t, s.url)
			streams := eventStreams(c)
			ctx := ctxT(t, pat.scale(60*time.Second))
			key := "jobs/nightly report"
			// A duration for the CLI: base scaled, in milliseconds.
			cliDuration := func(base time.Duration) string { return fmt.Sprintf("%dms", pat.scale(base).Milliseconds()) }

			// Go holds: the CLI is refused.
			g1, err := c.Acquire(ctx, key, TTL(pat.scale(5*time.Second)), Wait(0))
			if err != nil {
				t.Fatal(err)
			}
			if code, out := cli(t, nil, "--url", s.url, "acquire", key, "--wait", "0"); code != 75 {
				t.Fatalf("the CLI acquired a key the Go client holds: exit %d, %s", code, out)
			}
			if err := g1.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if g1.Context().Err() == nil || context.Cause(g1.Context()) != ErrReleased {
				t.Fatalf("released lock's context: %v", context.Cause(g1.Context()))
			}

			// The CLI holds: Go is refused and sees the holder.
			code, out := cli(t, nil, "--url", s.url, "acquire", key, "--ttl", cliDuration(30*time.Second))
			m := acquiredRe.FindStringSubmatch(out)
			if code != 0 || m == nil {
				t.Fatalf("CLI acquire: exit %d, %q", code, out)
			}
			t2, _ := strconv.ParseUint(m[1], 10, 64)
			if t2 <= g1.Token() {
				t.Fatalf("CLI token %d not above Go's %d", t2, g1.Token())
			}
			_, err = c.TryAcquire(ctx, key)
			var e *Error
			if !errors.Is(err, ErrNotAcquired) || !errors.As(err, &e) || e.Holder == nil || e.Holder.Token != t2 {
				t.Fatalf("TryAcquire of a key the CLI holds: %v (%+v)", err, e)
			}

			// A Go waiter gets it when the CLI releases: released once the
			// waiter waits on the key's event stream.
			opened := streams()
			got := make(chan *Lock, 1)
			go func() {
				l, err := c.Acquire(ctx, key, Wait(pat.scale(20*time.Second)))
				if err != nil {
					t.Errorf("Go waiter: %v [%v]", err, pat)
				}
				got <- l
			}()
			pat.waitFor(t, 10*time.Second, "the Go waiter waiting on its event stream", func() bool { return streams() > opened })
			if code, out := cli(t, nil, "--url", s.url, "release", key, "--owner", m[2], "--token", m[1]); code != 0 {
				t.Fatalf("CLI release: exit %d %s", code, out)
			}
			g3 := <-got
			if g3 == nil {
				t.FailNow()
			}
			if g3.Token() <= t2 {
				t.Fatalf("Go token %d not above the CLI's %d", g3.Token(), t2)
			}

			// `fencelock run` waits for Go's lock and gets a higher token. It
			// waits by long polls of the service (http:// backend), which the
			// service counts.
			done := make(chan string, 1)
			go func() {
				code, out := cli(t, nil, "--url", s.url, "run", key, "--wait", cliDuration(20*time.Second), "--", "sh", "-c", "echo token=$FENCELOCK_TOKEN")
				done <- fmt.Sprintf("%d %s", code, out)
			}()
			var ran string
			pat.waitFor(t, 10*time.Second, "fencelock run waiting for the Go lock", func() bool {
				select {
				case ran = <-done:
					return true
				default:
				}
				st, err := c.Stats(ctx)
				return err == nil && st.Waiters > 0
			})
			if ran != "" {
				t.Fatalf("fencelock run did not wait for the Go lock: %s", ran)
			}
			if err := g3.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			var code4 int
			var t4 uint64
			if _, err := fmt.Sscanf(r, "%d token=%d", &code4, &t4); err != nil || code4 != 0 || t4 <= g3.Token() {
				t.Fatalf("fencelock run after the Go release: %q (Go token %d) [%v]", r, g3.Token(), pat)
			}

			// And Go again, above everything.
			g5, err := c.Acquire(ctx, key, Wait(pat.scale(5*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			if g5.Token() <= t4 {
				t.Fatalf("token %d not above %d", g5.Token(), t4)
			}
			if err := g5.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A held lock is renewed in the background past its TTL.
func TestRenewalKeepsTheLock(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	ctx := ctxT(t, pat.scale(30*time.Second))
	// A base of a second: the service answers a renewal under -race on a
	// loaded machine in a few hundred milliseconds, more than a shorter
	// lease's trusted time leaves after its renewal period.
	l, err := c.Acquire(ctx, "renewed", TTL(pat.scale(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	first := l.Deadline()
	// Held for four TTLs: the deadline moves on by at least two.
	time.Sleep(pat.scale(4 * time.Second))
	if !l.Valid() || l.Context().Err() != nil {
		t.Fatalf("lock lost while renewing: %v [%v]", l.Err(), pat)
	}
	if !l.Deadline().After(first.Add(pat.scale(2300 * time.Millisecond))) {
		t.Fatalf("deadline did not move: %v then %v [%v]", first, l.Deadline(), pat)
	}
	info, err := c.Inspect(ctx, "renewed")
	if err != nil || info.Token != l.Token() {
		t.Fatalf("inspect: %v %+v", err, info)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Inspect(ctx, "renewed"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("inspect after release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

// countingTransport counts the requests of each path family.
type countingTransport struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	family := req.URL.Path
	if strings.HasPrefix(family, "/v1/locks/") && strings.HasSuffix(family, "/renew") {
		family = "/v1/locks/*/renew"
	}
	c.mu.Lock()
	c.counts[family]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (c *countingTransport) get(family string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[family]
}

// Many locks renew in a few batched requests (POST /v1/renew), not one
// request each, and every one of them stays valid.
func TestManyLocksRenewInBatches(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	counting := &countingTransport{counts: map[string]int{}}
	c := newClient(t, s.url, WithHTTPClient(&http.Client{Transport: counting}))
	ctx := ctxT(t, pat.scale(60*time.Second))
	const n = 200
	locks := make([]*Lock, n)
	for i := range locks {
		l, err := c.Acquire(ctx, fmt.Sprintf("batch-%d", i), TTL(pat.scale(3*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = l
	}
	// Counted from here: while the locks were taken (as slowly as the
	// machine goes) the first ones renewed beside the acquisitions.
	batches0, single0 := counting.get("/v1/renew"), counting.get("/v1/locks/*/renew")
	// Held for ten renewal periods (a third of the TTL each).
	time.Sleep(pat.scale(10 * time.Second))
	for _, l := range locks {
		if !l.Valid() {
			t.Fatalf("%s lost while renewing: %v [%v]", l.Key(), l.Err(), pat)
		}
	}
	batches, single := counting.get("/v1/renew")-batches0, counting.get("/v1/locks/*/renew")-single0
	t.Logf("%d locks: %d batched and %d single renewal requests while held [%v]", n, batches, single, pat)
	// Each lock renewed about ten times: one request each would be some
	// 2,000 requests.
	if batches == 0 || batches+single > n*2 {
		t.Fatalf("%d batched and %d single renewal requests for %d locks [%v]", batches, single, n, pat)
	}
	for _, l := range locks {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Readers share a key and keep renewing; a writer waits for them all, then
// holds alone with a higher token than every reader's.
func TestSharedReadersExcludeAWriter(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	ctx := ctxT(t, pat.scale(30*time.Second))
	// A base of a second, as in TestRenewalKeepsTheLock.
	ttl := pat.scale(time.Second)
	r1, err := c.Acquire(ctx, "table", Shared(), TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.TryAcquire(ctx, "table", Shared(), TTL(ttl))
	if err != nil {
		t.Fatalf("a second reader was refused: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "table"); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	// Renewals of the readers' leases (three TTLs).
	time.Sleep(3 * ttl)
	if !r1.Valid() || !r2.Valid() {
		t.Fatalf("readers lost their leases: %v / %v [%v]", r1.Err(), r2.Err(), pat)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := c.Acquire(ctx, "table", Wait(pat.scale(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if w.Token() <= r1.Token() || w.Token() <= r2.Token() {
		t.Fatalf("writer token %d not above readers' %d, %d", w.Token(), r1.Token(), r2.Token())
	}
	if _, err := c.TryAcquire(ctx, "table", Shared()); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a reader beside a writer: %v", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
