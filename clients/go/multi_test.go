package fencelock

// Time: (b) every TTL, wait and bound is a base figure scaled by the
// test's measured patience (patience_test.go); the hand-off's bound stays
// far below the holder's lease end, where a waiter not woken would get the
// permit. The waiter is released to once it waits on its event stream,
// not after a sleep.

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSemaphore(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	streams := eventStreams(c)
	ctx := ctxT(t, pat.scale(30*time.Second))
	ttl := pat.scale(5 * time.Second)
	sem := c.Semaphore("encoders", 2)
	p1, err := sem.Acquire(ctx, TTL(ttl), Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.Acquire(ctx, TTL(ttl), Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if p1.Key() == p2.Key() {
		t.Fatalf("two permits on %s", p1.Key())
	}
	if _, err := sem.Acquire(ctx, Wait(0)); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("third permit: %v", err)
	}
	// The Rust CLI sees the semaphore full too.
	if code, out := cli(t, nil, "--url", s.url, "acquire", "--permits", "2", "encoders", "--wait", "0"); code != 75 {
		t.Fatalf("CLI took a permit of a full semaphore: %d %s", code, out)
	}
	if held, err := sem.Holders(ctx); err != nil || len(held) != 2 {
		t.Fatalf("holders %v %v", held, err)
	}
	opened := streams()
	got := make(chan *Lock, 1)
	go func() {
		p, err := sem.Acquire(ctx, TTL(ttl), Wait(pat.scale(10*time.Second)))
		if err != nil {
			t.Errorf("waiter: %v [%v]", err, pat)
		}
		got <- p
	}()
	pat.waitFor(t, 10*time.Second, "the waiter waiting on the semaphore's event stream", func() bool { return streams() > opened })
	released := time.Now()
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p3 := <-got
	if p3 == nil {
		t.FailNow()
	}
	handoff := time.Since(released)
	t.Logf("permit handed off in %v [%v]", handoff, pat)
	if bound := pat.scale(400 * time.Millisecond); handoff > bound || p3.Key() != p2.Key() || p3.Token() <= p2.Token() {
		t.Fatalf("permit %v after %v (bound %v) [%v]", p3, handoff, bound, pat)
	}
	_ = p1.Release(ctx)
	_ = p3.Release(ctx)
}

func TestAcquireAll(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	admin := newClient(t, s.url)
	ctx := ctxT(t, pat.scale(30*time.Second))
	// A base of 3 s: the loss of b is noticed at the next renewal (a third
	// of it), while a's own lease must not end by its deadline meanwhile
	// on a loaded machine, or a is lost too and left for its expiry.
	m, err := c.AcquireAll(ctx, []string{"b", "a"}, TTL(pat.scale(3*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Locks()) != 2 || m.Locks()[0].Key() != "a" {
		t.Fatalf("locks %v", m.Locks())
	}
	// All or none: c is not kept when a is held.
	if _, err := c.AcquireAll(ctx, []string{"c", "a"}, Wait(200*time.Millisecond)); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("overlapping set: %v [%v]", err, pat)
	}
	if _, err := c.Inspect(ctx, "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("c left held: %v", err)
	}
	if _, err := admin.ForceRelease(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Context().Done():
	case <-time.After(pat.scale(3 * time.Second)):
		t.Fatalf("losing one lock did not cancel the set's context [%v]", pat)
	}
	if !errors.Is(context.Cause(m.Context()), ErrLost) {
		t.Fatalf("cause %v", context.Cause(m.Context()))
	}
	_ = m.Release(ctx)
	if _, err := c.Inspect(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a not released: %v", err)
	}
}
