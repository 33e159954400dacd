package fencelock

import (
	"context"
	"encoding/json"
	"errors"
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
			s := startService(t, backend, false)
			c := newClient(t, s.url)
			ctx := ctxT(t, 60*time.Second)
			key := "paused"
			// 2 s: at the loss the backend's lease has 220 ms left, time
			// enough to read it even on a loaded machine.
			ttl := 2 * time.Second
			l, err := c.Acquire(ctx, key, TTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(150 * time.Millisecond)
			s.stop(t)
			stopped := time.Now()
			select {
			case <-l.Context().Done():
			case <-time.After(3 * ttl):
				s.cont(t)
				t.Fatal("the lock's context was not cancelled while the service was paused")
			}
			lostAt := time.Now()
			// The backend's view, read directly while the service is
			// paused: the lease is still there.
			inspected := time.Now()
			code, out := cli(t, nil, "--url", s.dbURL, "inspect", key, "--json")
			s.cont(t)
			var held struct {
				Token       uint64 `json:"token"`
				ExpiresInMs int64  `json:"expires_in_ms"`
			}
			if code != 0 || json.Unmarshal([]byte(out), &held) != nil {
				t.Fatalf("inspect on the backend at the loss: exit %d %q", code, out)
			}
			if held.Token != l.Token() || held.ExpiresInMs <= 0 {
				t.Fatalf("at the loss the backend shows %+v, want token %d unexpired", held, l.Token())
			}
			if backendEnd := inspected.Add(time.Duration(held.ExpiresInMs) * time.Millisecond); !lostAt.Before(backendEnd) {
				t.Fatalf("lost at %v, not before the backend's end %v", lostAt, backendEnd)
			}
			t.Logf("lost %v after the pause; the backend's lease had %d ms left", lostAt.Sub(stopped).Round(time.Millisecond), held.ExpiresInMs)
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
			if d := l.Deadline(); lostAt.Before(d) || lostAt.Sub(d) > 250*time.Millisecond {
				t.Fatalf("lost at %v, deadline %v", lostAt, d)
			}
			if l.Valid() {
				t.Fatal("a lost lock is valid")
			}
			if err := l.Release(ctx); !errors.Is(err, ErrLost) {
				t.Fatalf("release after loss: %v", err)
			}
			next, err := c.Acquire(ctx, key, Wait(10*time.Second))
			if err != nil {
				t.Fatal(err)
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
	s := startService(t, "sqlite", true)
	c := newClient(t, s.url, WithToken(clientToken))
	admin := newClient(t, s.url, WithToken(adminToken))
	ctx := ctxT(t, 30*time.Second)
	ttl := 1500 * time.Millisecond
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
	forced := time.Now()
	select {
	case <-l.Context().Done():
	case <-time.After(period(ttl) + 500*time.Millisecond):
		t.Fatal("not cancelled within a renewal period")
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
			s := startService(t, backend, false)
			holder := newClient(t, s.url)
			waiter := newClient(t, s.url)
			ctx := ctxT(t, 30*time.Second)
			a, err := holder.Acquire(ctx, "handoff", TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				l  *Lock
				at time.Time
			}
			got := make(chan result, 1)
			go func() {
				l, err := waiter.Acquire(ctx, "handoff", Wait(20*time.Second))
				if err != nil {
					t.Error(err)
				}
				got <- result{l, time.Now()}
			}()
			time.Sleep(400 * time.Millisecond)
			released := time.Now()
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.l == nil {
				t.FailNow()
			}
			handoff := r.at.Sub(released)
			t.Logf("hand-off %v", handoff)
			if handoff > 400*time.Millisecond {
				t.Fatalf("hand-off took %v", handoff)
			}
			if r.l.Token() <= a.Token() {
				t.Fatalf("token %d not above %d", r.l.Token(), a.Token())
			}
			_ = r.l.Release(ctx)

			// A wait that ends first is ErrNotAcquired, at its end, with
			// the holder.
			b, err := holder.Acquire(ctx, "handoff", TTL(10*time.Second))
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
			if took < 300*time.Millisecond || took > 700*time.Millisecond {
				t.Fatalf("Wait(300ms) returned after %v", took)
			}
			_ = b.Release(ctx)
		})
	}
}

// Renewals against a service that answers 503 are paced: a bounded number
// of requests before the loss, which comes at the lease's local deadline.
func TestFailingRenewalsBackOffUntilTheDeadline(t *testing.T) {
	var renewals atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/locks/k/acquire":
			_, _ = w.Write([]byte(`{"key":"k","owner":"o","token":7,"expires_at":"2026-01-01T00:00:00Z","ttl_ms":1000}`))
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
	l, err := c.Acquire(context.Background(), "k", TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	lostAfter := time.Since(sent)
	n := renewals.Load()
	t.Logf("lost after %v, %d renewal requests", lostAfter, n)
	if lostAfter < ValidFor(time.Second) || lostAfter > ValidFor(time.Second)+200*time.Millisecond {
		t.Fatalf("lost after %v, want about %v", lostAfter, ValidFor(time.Second))
	}
	// From ttl/3 to the deadline (0.56 s) with pauses of at least 5, 10,
	// 20, 40, 50, 50… ms: at most about 17 (docs/http.md).
	if n < 2 || n > 17 {
		t.Fatalf("%d renewal requests", n)
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != "deadline" || !errors.Is(l.Err(), ErrUnavailable) {
		t.Fatalf("Err() = %v", l.Err())
	}
}
