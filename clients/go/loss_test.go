package fencelock

// Time: (b) every TTL, wait and bound is a base figure scaled by the
// test's measured patience (patience_test.go); a bound on how late a
// loss, a wake-up or the end of a wait may come scales its slack, and
// stays far below the timer or deadline it tells apart from. "Not before"
// bounds need no scaling. The backend's end of a paused lease is read
// while the service is paused (it cannot move then), not raced against
// the lease's last 220 ms; a waiter is released once it waits on its
// event stream, not after a sleep.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// The service is paused (SIGSTOP) past the TTL: Context is cancelled at
// the lease's local deadline, while the backend still holds the lease,
// and the next holder's token is higher.
func TestLossWhenTheServiceStopsAnswering(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			pat := measurePatience()
			s := startService(t, backend, false)
			c := newClient(t, s.url)
			ctx := ctxT(t, pat.scale(60*time.Second))
			key := "paused"
			// The local deadline comes ttl/100 + min(ttl/10, 500 ms)
			// before the backend's end: 220 ms for 2 s. The backend is read
			// by the CLI while the service is paused, before the lease
			// ends: the TTL is also at least three such reads (the first
			// one timed here, of the key still free).
			read := time.Now()
			if code, out := cli(t, nil, "--url", s.dbURL, "inspect", key, "--json"); code != 1 {
				t.Fatalf("inspect of a free key: exit %d %q", code, out)
			}
			ttl := max(pat.scale(2*time.Second), 3*time.Since(read))
			t.Logf("TTL %v [%v]", ttl, pat)
			l, err := c.Acquire(ctx, key, TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			lostAtCh := make(chan time.Time, 1)
			go func() {
				<-l.Context().Done()
				lostAtCh <- time.Now()
			}()
			time.Sleep(150 * time.Millisecond)
			s.stop(t)
			stopped := time.Now()
			// The backend's view, read directly while the service is
			// paused: no renewal reaches the backend now, so the lease's
			// end stays where it is, however long the read takes.
			code, out := cli(t, nil, "--url", s.dbURL, "inspect", key, "--json")
			var held struct {
				Token     uint64    `json:"token"`
				ExpiresAt time.Time `json:"expires_at"`
			}
			if code != 0 || json.Unmarshal([]byte(out), &held) != nil {
				s.cont(t)
				t.Fatalf("inspect on the backend while paused: exit %d %q [%v]", code, out, pat)
			}
			var lostAt time.Time
			select {
			case lostAt = <-lostAtCh:
			case <-time.After(3 * ttl):
				s.cont(t)
				t.Fatalf("the lock's context was not cancelled while the service was paused [%v]", pat)
			}
			s.cont(t)
			if held.Token != l.Token() {
				t.Fatalf("while paused the backend shows %+v, want token %d", held, l.Token())
			}
			// The backend's clock is this machine's.
			if !lostAt.Before(held.ExpiresAt) {
				t.Fatalf("lost at %v, not before the backend's end %v [%v]", lostAt, held.ExpiresAt, pat)
			}
			t.Logf("lost %v after the pause, %v before the backend's end", lostAt.Sub(stopped).Round(time.Millisecond), held.ExpiresAt.Sub(lostAt).Round(time.Millisecond))
			var lost *LostError
			if cause := context.Cause(l.Context()); !errors.As(cause, &lost) || lost.Reason != "deadline" || !errors.Is(cause, ErrLost) {
				t.Fatalf("cause %v", cause)
			}
			if !errors.Is(l.Err(), ErrLost) {
				t.Fatalf("Err() = %v", l.Err())
			}
			select {
			case <-l.Lost():
			default:
				t.Fatal("Lost() not closed")
			}
			if d, late := l.Deadline(), pat.scale(250*time.Millisecond); lostAt.Before(d) || lostAt.Sub(d) > late {
				t.Fatalf("lost at %v, deadline %v (%v late at most) [%v]", lostAt, d, late, pat)
			}
			if l.Valid() {
				t.Fatal("a lost lock is valid")
			}
			if err := l.Release(ctx); !errors.Is(err, ErrLost) {
				t.Fatalf("release after loss: %v", err)
			}
			next, err := c.Acquire(ctx, key, Wait(pat.scale(10*time.Second)))
			if err != nil {
				t.Fatalf("%v [%v]", err, pat)
			}
			if next.Token() <= l.Token() {
				t.Fatalf("next token %d not above %d", next.Token(), l.Token())
			}
			_ = next.Release(ctx)
		})
	}
}

// An admin's force-release cancels the holder's context within a renewal
// period (the next renewal is refused).
func TestForceReleaseCancelsWithinARenewalPeriod(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", true)
	c := newClient(t, s.url, WithToken(clientToken))
	admin := newClient(t, s.url, WithToken(adminToken))
	ctx := ctxT(t, pat.scale(30*time.Second))
	ttl := pat.scale(1500 * time.Millisecond)
	l, err := c.Acquire(ctx, "forced", TTL(ttl), Owner("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Owner() != "worker-1" {
		t.Fatalf("owner shown %q", l.Owner())
	}
	if _, err := c.ForceRelease(ctx, "forced"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("client force-release: %v", err)
	}
	removed, err := admin.ForceRelease(ctx, "forced")
	if err != nil {
		t.Fatal(err)
	}
	if removed.Owner != "gotest/worker-1" || removed.Token != l.Token() {
		t.Fatalf("removed %+v", removed)
	}
	// A renewal period and a scaled slack: still short of the local
	// deadline (ValidFor(ttl)), where a loss would come without a refusal.
	forced := time.Now()
	select {
	case <-l.Context().Done():
	case <-time.After(period(ttl) + pat.scale(500*time.Millisecond)):
		t.Fatalf("not cancelled within a renewal period [%v]", pat)
	}
	t.Logf("cancelled %v after the force-release (renewal period %v)", time.Since(forced).Round(time.Millisecond), period(ttl))
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != "refused" || !errors.Is(lost, ErrNotHeld) {
		t.Fatalf("Err() = %v", l.Err())
	}
}

// A waiter is woken by the release through the event stream: the hand-off
// takes far less than the service's 500 ms listing interval, and the
// waiter's own timer (the holder's lease end) is seconds away.
func TestAWaiterIsWokenByTheRelease(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			pat := measurePatience()
			s := startService(t, backend, false)
			holder := newClient(t, s.url)
			waiter := newClient(t, s.url)
			streams := eventStreams(waiter)
			ctx := ctxT(t, pat.scale(30*time.Second))
			// The holder's lease end, the waiter's own timer, is ttl away:
			// 25 times the hand-off's bound.
			ttl := pat.scale(10 * time.Second)
			a, err := holder.Acquire(ctx, "handoff", TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				l  *Lock
				at time.Time
			}
			opened := streams()
			got := make(chan result, 1)
			go func() {
				l, err := waiter.Acquire(ctx, "handoff", Wait(pat.scale(20*time.Second)))
				if err != nil {
					t.Errorf("waiter: %v [%v]", err, pat)
				}
				got <- result{l, time.Now()}
			}()
			pat.waitFor(t, 10*time.Second, "the waiter waiting on its event stream", func() bool { return streams() > opened })
			released := time.Now()
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.l == nil {
				t.FailNow()
			}
			handoff := r.at.Sub(released)
			t.Logf("hand-off %v [%v]", handoff, pat)
			if bound := pat.scale(400 * time.Millisecond); handoff > bound {
				t.Fatalf("hand-off took %v, more than %v: not woken by the release [%v]", handoff, bound, pat)
			}
			if r.l.Token() <= a.Token() {
				t.Fatalf("token %d not above %d", r.l.Token(), a.Token())
			}
			_ = r.l.Release(ctx)

			// A wait that ends first is ErrNotAcquired, at its end, with
			// the holder.
			b, err := holder.Acquire(ctx, "handoff", TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = waiter.Acquire(ctx, "handoff", Wait(300*time.Millisecond))
			took := time.Since(start)
			var e *Error
			if !errors.Is(err, ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &e) || e.Holder == nil || e.Holder.Token != b.Token() {
				t.Fatalf("a wait that ended: %v", err)
			}
			if late := pat.scale(400 * time.Millisecond); took < 300*time.Millisecond || took > 300*time.Millisecond+late {
				t.Fatalf("Wait(300ms) returned after %v (at most %v late) [%v]", took, late, pat)
			}
			_ = b.Release(ctx)
		})
	}
}

// Renewals against a service that answers 503 are paced: a bounded number
// of requests before the loss, which comes at the lease's local deadline.
func TestFailingRenewalsBackOffUntilTheDeadline(t *testing.T) {
	pat := measurePatience()
	// The pauses between retries are fractions of the TTL, so the bounds
	// on their count hold for a scaled TTL too (up to 16 s, the margin's
	// 500 ms cap adds at most one request). Whole milliseconds, as granted.
	ttl := pat.scale(time.Second).Truncate(time.Millisecond)
	var renewals atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/locks/k/acquire":
			// Grants the TTL asked for.
			var asked struct {
				TTLms int64 `json:"ttl_ms"`
			}
			body, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(body, &asked)
			_, _ = fmt.Fprintf(w, `{"key":"k","owner":"o","token":7,"expires_at":"2026-01-01T00:00:00Z","ttl_ms":%d}`, asked.TTLms)
		case r.URL.Path == "/v1/locks/k/renew":
			renewals.Add(1)
			w.WriteHeader(503)
			_, _ = w.Write([]byte(`{"error":"down","code":"unavailable"}`))
		default:
			w.WriteHeader(200)
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	sent := time.Now()
	l, err := c.Acquire(context.Background(), "k", TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	lostAfter := time.Since(sent)
	n := renewals.Load()
	t.Logf("lost after %v, %d renewal requests [%v]", lostAfter, n, pat)
	if late := pat.scale(200 * time.Millisecond); lostAfter < ValidFor(ttl) || lostAfter > ValidFor(ttl)+late {
		t.Fatalf("lost after %v, want about %v (at most %v late) [%v]", lostAfter, ValidFor(ttl), late, pat)
	}
	// From ttl/3 to the deadline (0.56 s of a 1 s lease) with pauses of at
	// least 5, 10, 20, 40, 50, 50… ms: at most about 17 (docs/http.md). A
	// loaded machine only pauses longer.
	if n < 2 || n > 17 {
		t.Fatalf("%d renewal requests [%v]", n, pat)
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != "deadline" || !errors.Is(l.Err(), ErrUnavailable) {
		t.Fatalf("Err() = %v", l.Err())
	}
}
