package fencelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"time"
)

// LockInfo is a lease as the service shows it (GET /v1/locks/{key}).
// Times are on the backend's clock, for display only.
type LockInfo struct {
	Key        string          `json:"key"`
	Owner      string          `json:"owner"`
	Token      uint64          `json:"token"`
	Kind       *string         `json:"kind,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	AcquiredAt time.Time       `json:"acquired_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	// ExpiresInMs is measured on the backend's clock when it answered.
	ExpiresInMs int64 `json:"expires_in_ms"`
	// TTLms is the lease length last granted through the service, nil
	// when the lease was taken elsewhere.
	TTLms *int64 `json:"ttl_ms,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

type grantBody struct {
	Key       string    `json:"key"`
	Owner     string    `json:"owner"`
	Token     uint64    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	TTLms     int64     `json:"ttl_ms"`
}

type acquireBody struct {
	Owner    string  `json:"owner,omitempty"`
	TTLms    int64   `json:"ttl_ms"`
	Kind     string  `json:"kind,omitempty"`
	Data     any     `json:"data,omitempty"`
	MinToken *uint64 `json:"min_token,omitempty"`
	Mode     string  `json:"mode,omitempty"`
}

type leaseBody struct {
	Owner string `json:"owner"`
	Token uint64 `json:"token"`
	TTLms int64  `json:"ttl_ms,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig)

type lockConfig struct {
	ttl      time.Duration
	wait     time.Duration // < 0: until ctx is done
	owner    string
	kind     string
	data     any
	minToken *uint64
	mode     string // "" (exclusive) or "shared"
	refused  string // why an option was refused: the acquisition fails with ErrInvalid
}

// options applies opts to cfg; an option that refused its value makes the
// acquisition fail with ErrInvalid before anything is sent.
func (cfg *lockConfig) apply(op, key string, opts []LockOption) error {
	for _, o := range opts {
		o(cfg)
	}
	if cfg.refused != "" {
		return invalid(op, key, cfg.refused)
	}
	return nil
}

// Shared takes a reader's lease of a read-write lock: readers share the
// key, a writer (a plain Acquire) excludes them all (docs/rwlock.md). It
// needs a service whose backend offers read-write locks; elsewhere the
// acquisition fails with ErrUnsupported. A waiting writer does not post a
// writer intent, so a steady stream of readers can keep it waiting.
func Shared() LockOption { return func(c *lockConfig) { c.mode = "shared" } }

// TTL sets the lease length (default 30 s; the service takes 100 ms to
// 7 days). The lease is renewed every third of it.
func TTL(d time.Duration) LockOption { return func(c *lockConfig) { c.ttl = d } }

// Wait bounds how long Acquire waits for a held lock (default: until ctx
// is done). Wait(0) makes one attempt: a held lock fails at once with an
// error for which errors.Is(err, ErrNotAcquired). A negative wait is
// refused (ErrInvalid), as in the Rust, Node.js and Python clients.
func Wait(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if d < 0 {
			c.refused = fmt.Sprintf("wait %v is negative (Wait(0) makes one attempt)", d)
			return
		}
		c.wait = d
	}
}

// Owner names the holder (default: a unique owner the service makes up).
// With a client token the service stores it in the token's namespace and
// shows it back as given.
func Owner(owner string) LockOption { return func(c *lockConfig) { c.owner = owner } }

// Kind labels the lease (shown by inspect, list and stats).
func Kind(kind string) LockOption { return func(c *lockConfig) { c.kind = kind } }

// Data stores JSON metadata with the lease (any value encoding/json takes).
func Data(v any) LockOption { return func(c *lockConfig) { c.data = v } }

// MinToken asks for a token of at least floor, on backends that keep
// floors (ErrUnsupported elsewhere).
func MinToken(floor uint64) LockOption { return func(c *lockConfig) { c.minToken = &floor } }

// Lock is a held lease. Its Context is cancelled when the lock is lost
// (cause: a *LostError, errors.Is(cause, ErrLost)) or released (cause
// ErrReleased); stop acting on the protected resource then.
type Lock struct {
	c      *Client
	key    string
	owner  string
	token  uint64
	mode   string // "" or "shared", as acquired
	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}

	// Guarded by c.renewer.mu.
	ttl      time.Duration // asked at each renewal
	granted  time.Duration // last granted
	deadline time.Time     // local trust ends (I5)
	// bootDeadline is the same end on the boot-time clock (0: none).
	bootDeadline time.Duration
	expiresAt    time.Time     // backend's clock, display
	next         time.Time     // next renewal; zero while one is in flight
	timer        time.Time     // min(next, deadline): the renewer's one timer
	index        int           // in the renewer's heap; -1 when not scheduled
	retryCap     time.Duration // backoff cap during a streak of failures
	lastErr      error
	done         bool
	err          error
}

// Key is the lock's key.
func (l *Lock) Key() string { return l.key }

// Owner is the holder's name as the service showed it.
func (l *Lock) Owner() string { return l.owner }

// Token is the fencing token: present it to every protected resource.
func (l *Lock) Token() uint64 { return l.token }

// Context is cancelled when the lock is lost or released; context.Cause
// says which (a *LostError or ErrReleased).
func (l *Lock) Context() context.Context { return l.ctx }

// Lost is closed when the lock is lost (not when it is released).
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lock is held or after a normal Release, and a
// *LostError (errors.Is(err, ErrLost)) once it was lost.
func (l *Lock) Err() error {
	l.c.renewer.mu.Lock()
	defer l.c.renewer.mu.Unlock()
	return l.err
}

// Deadline is the local instant (monotonic) until which the lease is
// trusted; the renewer moves it at each confirmed renewal.
func (l *Lock) Deadline() time.Time {
	l.c.renewer.mu.Lock()
	defer l.c.renewer.mu.Unlock()
	return l.deadline
}

// Valid reports whether the lease is still trusted: held, and before its
// deadline. Check it just before an action the token does not guard.
func (l *Lock) Valid() bool {
	l.c.renewer.mu.Lock()
	defer l.c.renewer.mu.Unlock()
	return !l.done && time.Now().Before(l.deadline) && !l.bootExpired()
}

// TTL is the lease length last granted.
func (l *Lock) TTL() time.Duration {
	l.c.renewer.mu.Lock()
	defer l.c.renewer.mu.Unlock()
	return l.granted
}

// String describes the lock for logs.
func (l *Lock) String() string {
	return fmt.Sprintf("lock %q owner %q token %d", l.key, l.owner, l.token)
}

// finish ends the lock once: stops its renewal, forgets it and cancels its
// context with cause. It reports whether this call ended it.
func (l *Lock) finish(cause error) bool {
	r := l.c.renewer
	r.mu.Lock()
	if l.done {
		r.mu.Unlock()
		return false
	}
	l.done = true
	var lost *LostError
	isLost := errors.As(cause, &lost)
	if isLost {
		l.err = cause
	}
	r.remove(l)
	r.mu.Unlock()
	l.c.mu.Lock()
	delete(l.c.held, l)
	l.c.mu.Unlock()
	l.cancel(cause)
	if isLost {
		close(l.lost)
	}
	return true
}

// Release ends the lease on the service and cancels Context (cause
// ErrReleased). After a loss it returns the *LostError; a second Release
// returns nil. A release the service did not confirm is harmless: the
// lease ends by expiry.
func (l *Lock) Release(ctx context.Context) error {
	if !l.finish(ErrReleased) {
		return l.Err()
	}
	return l.c.release(ctx, l.key, l.owner, l.token, l.mode)
}

// Renew renews the lease now (the renewer also does, every third of the
// TTL). A refusal is a loss: it returns the *LostError.
func (l *Lock) Renew(ctx context.Context) error {
	r := l.c.renewer
	r.mu.Lock()
	if l.done {
		r.mu.Unlock()
		if err := l.Err(); err != nil {
			return err
		}
		return &Error{Op: "renew", Key: l.key, Code: "not_held", Message: "the lock was released"}
	}
	ttl := l.ttl
	r.mu.Unlock()
	sent := now()
	g, err := l.c.renew(ctx, l, ttl, l.c.timeout)
	r.settle(l, sent, g, err)
	if errors.Is(err, ErrNotHeld) {
		return l.Err()
	}
	return err
}

func (c *Client) renew(ctx context.Context, l *Lock, ttl, bound time.Duration) (*grantBody, error) {
	var g grantBody
	err := c.do(ctx, "renew", l.key, "POST", c.path("v1", "locks", l.key, "renew"),
		leaseBody{Owner: l.owner, Token: l.token, TTLms: ttl.Milliseconds(), Mode: l.mode}, &g, bound)
	if err != nil {
		return nil, err
	}
	return &g, nil
}

func (c *Client) release(ctx context.Context, key, owner string, token uint64, mode string) error {
	return c.send(ctx, "release", key, "POST", c.path("v1", "locks", key, "release"),
		leaseBody{Owner: owner, Token: token, Mode: mode}, nil, 0)
}

// TryAcquire is Acquire with Wait(0): one attempt.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	return c.Acquire(ctx, key, append(opts, Wait(0))...)
}

// Acquire takes the lock key, waiting while it is held (up to the Wait
// option, default until ctx is done). A waiter follows the service's
// event stream for the key (GET /v1/events?key=) and tries again when the
// holder releases or loses it, or when the holder's lease ends; without
// the stream it backs off (1 ms doubling to 1 s, jittered). Transient
// failures are retried while the wait lasts.
//
// Errors: ErrNotAcquired (held; the *Error's Holder says by whom),
// ErrInvalid, ErrUnavailable, ErrUnauthorized, …; when ctx ends first, the
// error also matches ctx.Err().
func (c *Client) Acquire(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	cfg := lockConfig{ttl: DefaultTTL, wait: -1}
	if err := cfg.apply("acquire", key, opts); err != nil {
		return nil, err
	}
	if key == "" {
		return nil, invalid("acquire", key, "empty lock key")
	}
	if cfg.ttl <= 0 {
		return nil, invalid("acquire", key, "TTL must be positive")
	}
	var until time.Time
	if cfg.wait >= 0 {
		until = time.Now().Add(cfg.wait)
	}
	var (
		sub     *wakeups
		noSub   bool
		poll    = backoff{initial: time.Millisecond, max: time.Second}
		retry   = backoff{initial: 10 * time.Millisecond, max: time.Second}
		lastErr error
		timer   *time.Timer
	)
	defer func() {
		sub.close()
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil, ctxError("acquire", key, ctx, lastErr)
		}
		l, err := c.attempt(ctx, key, &cfg)
		if err == nil {
			return l, nil
		}
		lastErr = err
		var e *Error
		if !errors.As(err, &e) || !(e.Code == "held" || e.transient()) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctxError("acquire", key, ctx, lastErr)
		}
		now := time.Now()
		if cfg.wait == 0 || (!until.IsZero() && !now.Before(until)) {
			return nil, err
		}
		var pause time.Duration
		if e.Code == "held" {
			retry.reset()
			if sub == nil && !noSub {
				// Subscribed before trying again: a release after the
				// stream's head is seen, one before it by the next try.
				s, err := c.subscribe(ctx, key)
				if err != nil {
					noSub = true
				} else {
					sub = s
					continue
				}
			}
			if sub != nil {
				pause = 30 * time.Second
			} else {
				pause = poll.pause()
			}
			if e.Holder != nil {
				// Never past the holder's end: expiries are announced
				// only by the service's periodic listing.
				ends := time.Duration(e.Holder.ExpiresInMs)*time.Millisecond + 2*time.Millisecond
				if ends < pause {
					pause = ends
				}
			}
		} else {
			pause = retry.retryPause()
		}
		if !until.IsZero() && until.Sub(now) < pause {
			pause = until.Sub(now)
		}
		if timer == nil {
			timer = time.NewTimer(pause)
		} else {
			timer.Reset(pause)
		}
		var wake, broken <-chan struct{}
		if sub != nil {
			wake, broken = sub.wake, sub.broken
		}
		select {
		case <-ctx.Done():
			return nil, ctxError("acquire", key, ctx, lastErr)
		case <-wake:
		case <-broken:
			sub.close()
			sub, noSub = nil, true
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// ctxError is the error of an operation that ctx ended: it matches
// ctx.Err() and, when an attempt failed before, that attempt's error.
func ctxError(op, key string, ctx context.Context, last error) error {
	if last != nil {
		return fmt.Errorf("%w (gave up: %w)", last, ctx.Err())
	}
	return &Error{Op: op, Key: key, Message: ctx.Err().Error(), Err: ctx.Err()}
}

// attempt is one acquire request, with t_sent taken before it leaves.
func (c *Client) attempt(ctx context.Context, key string, cfg *lockConfig) (*Lock, error) {
	body := acquireBody{Owner: cfg.owner, TTLms: cfg.ttl.Milliseconds(), Kind: cfg.kind, Data: cfg.data, MinToken: cfg.minToken, Mode: cfg.mode}
	sent := now() // I5: before the request is sent (monotonic and boot-time)
	var g grantBody
	if err := c.do(ctx, "acquire", key, "POST", c.path("v1", "locks", key, "acquire"), body, &g, 0); err != nil {
		return nil, err
	}
	granted := time.Duration(g.TTLms) * time.Millisecond
	deadline := sent.mono.Add(ValidFor(granted))
	if !time.Now().Before(deadline) {
		// The answer came after the instant until which it could be
		// trusted: give the grant back and count a failed attempt.
		c.releaseInBackground(key, g.Owner, g.Token, cfg.mode)
		return nil, &Error{Op: "acquire", Key: key, Code: "timeout",
			Message: fmt.Sprintf("the round trip (%v) outlasted the trusted part of the %v lease", time.Since(sent.mono).Round(time.Millisecond), granted)}
	}
	lctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	l := &Lock{
		c: c, key: key, owner: g.Owner, token: g.Token, mode: cfg.mode,
		ctx: lctx, cancel: cancel, lost: make(chan struct{}),
		ttl: cfg.ttl, granted: granted, deadline: deadline, expiresAt: g.ExpiresAt,
		index: -1,
	}
	if sent.bootOK {
		l.bootDeadline = sent.boot + ValidFor(granted)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cancel(ErrClosed)
		c.releaseInBackground(key, g.Owner, g.Token, cfg.mode)
		return nil, &Error{Op: "acquire", Key: key, Message: "client closed", Err: ErrClosed}
	}
	c.held[l] = struct{}{}
	c.mu.Unlock()
	c.renewer.add(l, sent)
	return l, nil
}

// releaseInBackground hands a lease back without making the caller wait.
func (c *Client) releaseInBackground(key, owner string, token uint64, mode string) {
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		_ = c.release(ctx, key, owner, token, mode)
	}()
}

// Run acquires key, runs fn under the lock with a context cancelled when
// ctx is or the lock is lost, and releases the lock after. If the lock was
// lost, the error matches ErrLost (joined with fn's error, if any).
func (c *Client) Run(ctx context.Context, key string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.Context(), func() { cancel(context.Cause(l.Context())) })
	ferr := fn(runCtx, l)
	stop()
	cancel(nil)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer rcancel()
	rerr := l.Release(rctx)
	if lost := l.Err(); lost != nil {
		if ferr != nil && !errors.Is(ferr, ErrLost) {
			return errors.Join(lost, ferr)
		}
		return lost
	}
	if ferr != nil {
		return ferr
	}
	if rerr != nil && !errors.Is(rerr, ErrUnavailable) {
		return rerr
	}
	return nil
}

// backoff is exponential backoff with jitter (backoff.rs).
type backoff struct {
	initial, max, cap time.Duration
}

func (b *backoff) grow() {
	if b.cap == 0 {
		b.cap = b.initial
	}
}

// pause is uniform in [0, cap] ("full jitter"), then the cap doubles.
func (b *backoff) pause() time.Duration {
	b.grow()
	p := time.Duration(rand.Int63n(int64(b.cap) + 1))
	b.cap = min(b.cap*2, b.max)
	return p
}

// retryPause is uniform in [cap/2, cap] ("equal jitter"): a lone retry
// never fires twice within a millisecond at a service that is down.
func (b *backoff) retryPause() time.Duration {
	b.grow()
	p := b.cap/2 + time.Duration(rand.Int63n(int64(b.cap-b.cap/2)+1))
	b.cap = min(b.cap*2, b.max)
	return p
}

func (b *backoff) reset() { b.cap = 0 }
