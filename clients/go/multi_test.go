package fencelock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSemaphore(t *testing.T) {
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	ctx := ctxT(t, 30*time.Second)
	sem := c.Semaphore("encoders", 2)
	p1, err := sem.Acquire(ctx, TTL(5*time.Second), Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.Acquire(ctx, TTL(5*time.Second), Wait(0))
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
	got := make(chan *Lock, 1)
	go func() {
		p, err := sem.Acquire(ctx, TTL(5*time.Second), Wait(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	time.Sleep(300 * time.Millisecond)
	released := time.Now()
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p3 := <-got
	if p3 == nil {
		t.FailNow()
	}
	t.Logf("permit handed off in %v", time.Since(released))
	if time.Since(released) > 400*time.Millisecond || p3.Key() != p2.Key() || p3.Token() <= p2.Token() {
		t.Fatalf("permit %v after %v", p3, time.Since(released))
	}
	_ = p1.Release(ctx)
	_ = p3.Release(ctx)
}

func TestAcquireAll(t *testing.T) {
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	admin := newClient(t, s.url)
	ctx := ctxT(t, 30*time.Second)
	m, err := c.AcquireAll(ctx, []string{"b", "a"}, TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Locks()) != 2 || m.Locks()[0].Key() != "a" {
		t.Fatalf("locks %v", m.Locks())
	}
	// All or none: c is not kept when a is held.
	if _, err := c.AcquireAll(ctx, []string{"c", "a"}, Wait(200*time.Millisecond)); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("overlapping set: %v", err)
	}
	if _, err := c.Inspect(ctx, "c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("c left held: %v", err)
	}
	if _, err := admin.ForceRelease(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("losing one lock did not cancel the set's context")
	}
	if !errors.Is(context.Cause(m.Context()), ErrLost) {
		t.Fatalf("cause %v", context.Cause(m.Context()))
	}
	_ = m.Release(ctx)
	if _, err := c.Inspect(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a not released: %v", err)
	}
}
