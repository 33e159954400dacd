package fencelock

// Time: (b) the wait for the loss is a suspend check and a slack scaled by
// the test's measured patience (patience_test.go); the monotonic deadline
// is compared with itself before the suspend, not with the time left
// (which the wait, however long, uses up).

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

// A suspend (simulated: the boot-time clock jumps 60 s ahead of the
// monotonic one) ends a 30 s lease within a suspend check, though its
// monotonic deadline is far away.
func TestASuspendPastTheLeaseIsALoss(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the boot-time clock is read on Linux only")
	}
	pat := measurePatience()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/locks/s/acquire" || r.URL.Path == "/v1/locks/s/renew" {
			_, _ = w.Write([]byte(`{"key":"s","owner":"o","token":3,"expires_at":"2026-01-01T00:00:00Z","ttl_ms":30000}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	l, err := c.Acquire(context.Background(), "s", TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Valid() {
		t.Fatal("not valid after the grant")
	}
	deadline := l.Deadline()
	t.Cleanup(func() { bootSkew.Store(0) })
	bootSkew.Store(int64(60 * time.Second))
	if l.Valid() {
		t.Fatal("valid after the boot-time clock left the lease's window")
	}
	select {
	case <-l.Context().Done():
	case <-time.After(suspendCheck + pat.scale(time.Second)):
		t.Fatalf("no loss after the suspend [%v]", pat)
	}
	var lost *LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != "deadline" {
		t.Fatalf("Err() = %v", l.Err())
	}
	if l.Deadline().Before(deadline) {
		t.Fatalf("the monotonic deadline moved: %v, was %v", l.Deadline(), deadline)
	}
}
