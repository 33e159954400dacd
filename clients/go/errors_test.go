package fencelock

// Time: (b) every TTL, wait and bound is a base figure scaled by the
// test's measured patience (patience_test.go). A deadline the test sets to
// see it honoured stays as it is; only the slack allowed past it is
// scaled, and it stays far below the retries or the 10 s request timeout
// it tells apart. "Not before the deadline" needs no scaling.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Bad input is a typed error, never a retry, and never past the caller's
// deadline.
func TestBadInputGivesTypedErrors(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", true)
	c := newClient(t, s.url, WithToken(clientToken))
	// A retry would go on until ctx ends: the bound of one call is a fifth
	// of it.
	ctx := ctxT(t, pat.scale(5*time.Second))
	bound := pat.scale(time.Second)
	cases := []struct {
		name string
		call func() error
		want error
		code string
	}{
		{"empty key", func() error { _, err := c.Acquire(ctx, "", TTL(time.Second)); return err }, ErrInvalid, "bad_request"},
		{"TTL too short", func() error { _, err := c.Acquire(ctx, "k", TTL(50*time.Millisecond)); return err }, ErrInvalid, "invalid_ttl"},
		{"control character", func() error { _, err := c.Acquire(ctx, "bad\x01key"); return err }, ErrInvalid, "invalid_key"},
		{"key too long", func() error { _, err := c.Acquire(ctx, strings.Repeat("k", 300)); return err }, ErrInvalid, "invalid_key"},
		{"owner too long", func() error { _, err := c.Acquire(ctx, "k", Owner(strings.Repeat("o", 300))); return err }, ErrInvalid, "invalid_owner"},
		{"release of a lease not held", func() error { return c.release(ctx, "k", "nobody", 42, "") }, ErrNotHeld, "not_held"},
		{"inspect a free lock", func() error { _, err := c.Inspect(ctx, "free"); return err }, ErrNotFound, "not_found"},
		{"client force-release", func() error { _, err := c.ForceRelease(ctx, "k"); return err }, ErrForbidden, "forbidden"},
	}
	for _, tc := range cases {
		start := time.Now()
		err := tc.call()
		var e *Error
		if !errors.Is(err, tc.want) || !errors.As(err, &e) || e.Code != tc.code {
			t.Errorf("%s: %v (want %v, code %s)", tc.name, err, tc.want, tc.code)
		}
		if took := time.Since(start); took > bound {
			t.Errorf("%s took %v, more than %v [%v]", tc.name, took, bound, pat)
		}
	}
	bad := newClient(t, s.url, WithToken("not-a-token-at-all-0000"))
	if _, err := bad.TryAcquire(ctx, "k"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("unknown token: %v", err)
	}
	// A stale token at a fence and in the fenced store.
	p := issuedTokens(t, ctx, c, "printer", 2)
	if err := c.Fence("printer").Admit(ctx, p[1]); err != nil {
		t.Fatal(err)
	}
	err := c.Fence("printer").Admit(ctx, p[0])
	var e *Error
	if !errors.Is(err, ErrStale) || !errors.As(err, &e) || e.Current == nil || *e.Current != p[1] {
		t.Errorf("stale admission: %v", err)
	}
	if cur, ok, err := c.Fence("printer").Current(ctx); err != nil || !ok || cur != p[1] {
		t.Errorf("fence current: %d %v %v", cur, ok, err)
	}
	// A token the store never issued.
	if err := c.Fence("printer").Admit(ctx, p[1]+1_000_000); !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Code != "invalid_token" {
		t.Errorf("a token never issued: %v, want ErrInvalid (invalid_token)", err)
	}
	d := issuedTokens(t, ctx, c, "doc", 2)
	if err := c.KVPut(ctx, "doc", d[1], map[string]int{"v": 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.KVPut(ctx, "doc", d[0], map[string]int{"v": 2}); !errors.Is(err, ErrStale) {
		t.Errorf("stale write: %v", err)
	}
	if v, err := c.KVGet(ctx, "doc"); err != nil || v.Token != d[1] || string(v.Value) != `{"v":1}` {
		t.Errorf("kv get: %+v %v", v, err)
	}
}

// Every input the client refuses matches ErrInvalid, whether the service
// or the client refused it: a bad base URL or option, a negative wait
// (not silently a single try), and a long key is not echoed whole.
func TestEveryRefusedInputIsErrInvalid(t *testing.T) {
	for _, base := range []string{"foo://x", "http://", "://nothing", "http://h:port"} {
		if _, err := NewClient(base); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewClient(%q): %v, want ErrInvalid", base, err)
		}
	}
	if _, err := NewClient("http://127.0.0.1:1", WithTimeout(-time.Second)); !errors.Is(err, ErrInvalid) {
		t.Errorf("WithTimeout(-1s): %v, want ErrInvalid", err)
	}
	if _, err := NewClient("http://127.0.0.1:1", WithHTTPClient(nil)); !errors.Is(err, ErrInvalid) {
		t.Errorf("WithHTTPClient(nil): %v, want ErrInvalid", err)
	}
	if _, err := NewClient("foo://user:secret@x"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a bad URL's password is shown: %v", err)
	}

	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	ctx := ctxT(t, pat.scale(5*time.Second))
	// A free key: a negative wait used to become Wait(0) and acquire it.
	if l, err := c.Acquire(ctx, "negative-wait", Wait(-time.Second)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Wait(-1s): %v, want ErrInvalid", err)
		if l != nil {
			_ = l.Release(ctx)
		}
	}
	if _, err := c.Semaphore("negative-wait", 2).Acquire(ctx, Wait(-1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("semaphore Wait(-1): %v, want ErrInvalid", err)
	}
	if _, err := c.AcquireAll(ctx, []string{"a", "b"}, Wait(-1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("AcquireAll Wait(-1): %v, want ErrInvalid", err)
	}
	long := strings.Repeat("k", 10000)
	_, err := c.Acquire(ctx, long)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("a 10,000-byte key: %v", err)
	}
	if msg := err.Error(); len(msg) > 300 || !strings.Contains(msg, "(10002 bytes)") {
		t.Errorf("a 10,000-byte key's error is %d bytes long: %.400s", len(msg), msg)
	}
}

// A dead or hung service gives ErrUnavailable within the caller's deadline.
func TestADeadServiceGivesTypedErrorsInTime(t *testing.T) {
	pat := measurePatience()
	// What a call may take past its deadline (or the client's timeout):
	// 200 ms on a quiet machine, far below the 10 s request timeout a
	// call that ignored its deadline would wait for.
	slack := pat.scale(200 * time.Millisecond)
	dead := newClient(t, fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
	start := time.Now()
	if _, err := dead.TryAcquire(context.Background(), "k"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("try against a dead service: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	_, err := dead.Acquire(ctx, "k")
	took := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire against a dead service: %v", err)
	}
	if took > 400*time.Millisecond+slack {
		t.Fatalf("took %v past a 400 ms deadline (slack %v) [%v]", took, slack, pat)
	}

	// Hung: the service is paused.
	s := startService(t, "sqlite", false)
	hung := newClient(t, s.url)
	s.stop(t)
	defer s.cont(t)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start = time.Now()
	_, err = hung.Acquire(ctx2, "k")
	if took := time.Since(start); took > 300*time.Millisecond+slack {
		t.Fatalf("took %v past a 300 ms deadline (slack %v) [%v]", took, slack, pat)
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire against a hung service: %v", err)
	}
	hung2 := newClient(t, s.url, WithTimeout(200*time.Millisecond))
	start = time.Now()
	if _, err := hung2.TryAcquire(context.Background(), "k"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("try against a hung service: %v", err)
	}
	if took := time.Since(start); took > 200*time.Millisecond+slack {
		t.Fatalf("WithTimeout(200ms) took %v (slack %v) [%v]", took, slack, pat)
	}
}

// Run holds the lock for the function, releases after, and reports a loss.
func TestRun(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	ctx := ctxT(t, pat.scale(20*time.Second))
	var token uint64
	err := c.Run(ctx, "run", func(ctx context.Context, l *Lock) error {
		token = l.Token()
		if _, err := c.TryAcquire(ctx, "run"); !errors.Is(err, ErrNotAcquired) {
			return fmt.Errorf("not exclusive: %v", err)
		}
		return c.KVPut(ctx, "run", l.Token(), "done")
	}, TTL(pat.scale(time.Second)))
	if err != nil || token == 0 {
		t.Fatalf("Run: %v [%v]", err, pat)
	}
	if _, err := c.Inspect(ctx, "run"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("not released after Run: %v", err)
	}
	fnErr := errors.New("work failed")
	if err := c.Run(ctx, "run", func(context.Context, *Lock) error { return fnErr }); err != fnErr {
		t.Fatalf("Run returned %v", err)
	}
	// Lost during Run: the function's context is cancelled and Run says so.
	err = c.Run(ctx, "run", func(ctx context.Context, l *Lock) error {
		if _, err := c.ForceRelease(ctx, "run"); err != nil {
			return err
		}
		<-ctx.Done()
		return context.Cause(ctx)
	}, TTL(pat.scale(600*time.Millisecond)))
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Run after a loss: %v [%v]", err, pat)
	}
}

// The LockManager adapter.
func TestManager(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	c := newClient(t, s.url)
	var m LockManager = NewManager(c)
	ctx := ctxT(t, pat.scale(20*time.Second))
	ttl := pat.scale(time.Second)
	if ok, err := m.TryLock(ctx, "m", ttl); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := m.TryLock(ctx, "m", ttl); ok || err != nil {
		t.Fatal("second TryLock", ok, err, pat)
	}
	other := NewManager(newClient(t, s.url))
	if ok, err := other.TryLock(ctx, "m", ttl); ok || err != nil {
		t.Fatal("other TryLock", ok, err, pat)
	}
	tok, err := m.GetFencingToken(ctx, "m")
	if err != nil || tok == 0 {
		t.Fatal(tok, err)
	}
	if locked, err := m.IsLocked(ctx, "m"); !locked || err != nil {
		t.Fatal(locked, err)
	}
	if err := m.Renew(ctx, "m", pat.scale(2*time.Second)); err != nil {
		t.Fatal(err, pat)
	}
	if err := m.Unlock(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx, "m"); !errors.Is(err, ErrNotHeld) {
		t.Fatal(err)
	}
	if locked, err := m.IsLocked(ctx, "m"); locked || err != nil {
		t.Fatal(locked, err)
	}
	if err := other.Lock(ctx, "m", ttl); err != nil {
		t.Fatal(err)
	}
	if tok2, _ := other.GetFencingToken(ctx, "m"); tok2 <= tok {
		t.Fatalf("token %d not above %d", tok2, tok)
	}
	if _, err := m.GetFencingToken(ctx, "m"); !errors.Is(err, ErrNotHeld) {
		t.Fatal(err)
	}
}

// Closing releases what the client holds, cancels it, and leaves no
// goroutine behind: not the renewer, not a waiter's event stream, not a
// connection.
func TestNoGoroutineLeaks(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	func() {
		c, err := NewClient(s.url)
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t, pat.scale(20*time.Second))
		a, err := c.Acquire(ctx, "leak", TTL(pat.scale(300*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		// The waiter's deadline: long enough for its event stream, and the
		// test's, to open first.
		wctx, wcancel := context.WithTimeout(ctx, pat.scale(500*time.Millisecond))
		defer wcancel()
		go func() { _, err := c.Acquire(wctx, "leak"); waited <- err }()
		events, err := c.Events(wctx, EventFilter{Prefix: "le"})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-waited; !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter: %v [%v]", err, pat)
		}
		for range events {
		}
		held, err := c.Acquire(ctx, "leak2", TTL(pat.scale(time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		_ = a.Release(ctx)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		var lost *LostError
		if !errors.As(context.Cause(held.Context()), &lost) || lost.Reason != "closed" {
			t.Fatalf("held lock after Close: %v [%v]", context.Cause(held.Context()), pat)
		}
		if _, err := c.TryAcquire(ctx, "leak3"); !errors.Is(err, ErrClosed) {
			t.Fatalf("after Close: %v", err)
		}
		probe := newClient(t, s.url)
		if _, err := probe.Inspect(ctx, "leak2"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Close did not release: %v", err)
		}
		_ = probe.Close()
	}()
	http.DefaultClient.CloseIdleConnections()
	deadline := time.Now().Add(pat.scale(3 * time.Second))
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines before, %d after [%v]:\n%s", before, runtime.NumGoroutine(), pat, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
