package fencelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"time"
)

// Semaphore is a semaphore of Permits permits (docs/semaphore.md): permit i
// is the lease on the slot key fencelock/semaphore/NAME/i, so each permit
// is an ordinary lock with its own token, renewed and lost like one. It
// interoperates with the Rust library and `fencelock run --permits`.
type Semaphore struct {
	c       *Client
	name    string
	permits int
}

// Semaphore is the semaphore name of permits permits (1–10,000).
func (c *Client) Semaphore(name string, permits int) *Semaphore {
	return &Semaphore{c: c, name: name, permits: permits}
}

// SlotKey is the key of permit slot.
func (s *Semaphore) SlotKey(slot int) string {
	return fmt.Sprintf("fencelock/semaphore/%s/%d", s.name, slot)
}

// Acquire takes one permit: a Lock on a free slot key (fence that key with
// its token). It tries slot 0, then the others in a random rotation;
// while all are taken it waits (Wait option, default until ctx is done)
// for a release on any slot, from one event stream on the semaphore's
// prefix, or for the earliest end among the holders it met. Wait(0) tries
// every slot once.
func (s *Semaphore) Acquire(ctx context.Context, opts ...LockOption) (*Lock, error) {
	if s.permits < 1 || s.permits > 10000 {
		return nil, invalid("semaphore", s.name, "permits must be 1–10,000")
	}
	cfg := lockConfig{ttl: DefaultTTL, wait: -1}
	if err := cfg.apply("semaphore", s.name, opts); err != nil {
		return nil, err
	}
	var until time.Time
	if cfg.wait >= 0 {
		until = time.Now().Add(cfg.wait)
	}
	var sub *wakeups
	noSub := false
	poll := backoff{initial: time.Millisecond, max: time.Second}
	defer func() { sub.close() }()
	var lastErr error
	for {
		if ctx.Err() != nil {
			return nil, ctxError("semaphore", s.name, ctx, lastErr)
		}
		soonest := time.Duration(-1)
		start := 0
		if s.permits > 1 {
			start = rand.Intn(s.permits - 1)
		}
		for i := 0; i < s.permits; i++ {
			slot := 0 // slot 0 first, then the others from a random one
			if i > 0 {
				slot = 1 + (start+i-1)%(s.permits-1)
			}
			l, err := s.c.attempt(ctx, s.SlotKey(slot), &cfg)
			if err == nil {
				return l, nil
			}
			var e *Error
			if !errors.As(err, &e) || !(e.Code == "held" || e.transient()) {
				return nil, err
			}
			lastErr = err
			if e.Holder != nil {
				if d := time.Duration(e.Holder.ExpiresInMs) * time.Millisecond; soonest < 0 || d < soonest {
					soonest = d
				}
			}
		}
		now := time.Now()
		if cfg.wait == 0 || (!until.IsZero() && !now.Before(until)) {
			return nil, lastErr
		}
		if sub == nil && !noSub {
			w, err := s.c.subscribePrefix(ctx, "fencelock/semaphore/"+s.name+"/")
			if err != nil {
				noSub = true
			} else {
				sub = w
				continue
			}
		}
		pause := 30 * time.Second
		if sub == nil {
			pause = poll.pause()
		}
		if soonest >= 0 && soonest+2*time.Millisecond < pause {
			pause = soonest + 2*time.Millisecond
		}
		if !until.IsZero() && until.Sub(now) < pause {
			pause = until.Sub(now)
		}
		t := time.NewTimer(pause)
		var wake, broken <-chan struct{}
		if sub != nil {
			wake, broken = sub.wake, sub.broken
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-broken:
			sub.close()
			sub, noSub = nil, true
		case <-t.C:
		}
		t.Stop()
	}
}

// Holders are the permits held now.
func (s *Semaphore) Holders(ctx context.Context) ([]LockInfo, error) {
	all, err := s.c.List(ctx, "fencelock/semaphore/"+s.name+"/")
	if err != nil {
		return nil, err
	}
	held := all[:0]
	for _, l := range all {
		var slot int
		rest := strings.TrimPrefix(l.Key, "fencelock/semaphore/"+s.name+"/")
		if _, err := fmt.Sscanf(rest, "%d", &slot); err == nil && fmt.Sprint(slot) == rest && slot < s.permits {
			held = append(held, l)
		}
	}
	return held, nil
}

// MultiLock is several locks held together (AcquireAll).
type MultiLock struct {
	locks  []*Lock
	ctx    context.Context
	cancel context.CancelCauseFunc
	stops  []func() bool
}

// Locks are the locks held, in key order.
func (m *MultiLock) Locks() []*Lock { return m.locks }

// Context is cancelled as soon as any of the locks is lost or released.
func (m *MultiLock) Context() context.Context { return m.ctx }

// Release releases every lock; the first error is returned.
func (m *MultiLock) Release(ctx context.Context) error {
	var first error
	for _, l := range m.locks {
		if err := l.Release(ctx); err != nil && first == nil {
			first = err
		}
	}
	for _, stop := range m.stops {
		stop()
	}
	m.cancel(ErrReleased)
	return first
}

// AcquireAll takes every key or none: one by one in sorted order (the
// service has no multi-key route; sorted order makes two callers of
// overlapping sets wait rather than deadlock), within one Wait for the
// whole call. On failure the keys taken are released.
func (c *Client) AcquireAll(ctx context.Context, keys []string, opts ...LockOption) (*MultiLock, error) {
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, invalid("acquire", sorted[i], "key given twice")
		}
	}
	if len(sorted) == 0 {
		return nil, invalid("acquire", "", "no keys")
	}
	cfg := lockConfig{wait: -1}
	if err := cfg.apply("acquire", "", opts); err != nil {
		return nil, err
	}
	var until time.Time
	if cfg.wait > 0 {
		until = time.Now().Add(cfg.wait)
	}
	m := &MultiLock{}
	m.ctx, m.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	for _, key := range sorted {
		o := append([]LockOption(nil), opts...)
		if !until.IsZero() {
			o = append(o, Wait(max(time.Until(until), 0)))
		}
		l, err := c.Acquire(ctx, key, o...)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
			_ = m.Release(rctx)
			cancel()
			return nil, err
		}
		m.locks = append(m.locks, l)
		m.stops = append(m.stops, context.AfterFunc(l.Context(), func() { m.cancel(context.Cause(l.Context())) }))
	}
	return m, nil
}
