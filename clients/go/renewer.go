package fencelock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// stamp is the instant a request was sent, on the monotonic clock and, where
// the OS has one, on the boot-time clock, which keeps counting while the
// machine is suspended (crates/fencelock-core/src/clock.rs): a lease is
// trusted only while both clocks are inside its window.
type stamp struct {
	mono   time.Time
	boot   time.Duration
	bootOK bool
}

// bootSkew is added to the boot-time clock: tests simulate a suspend with it.
var bootSkew atomic.Int64

func bootNow() (time.Duration, bool) {
	b, ok := bootClock()
	return b + time.Duration(bootSkew.Load()), ok
}

func now() stamp {
	s := stamp{mono: time.Now()}
	s.boot, s.bootOK = bootNow()
	return s
}

// epoch anchors monotonic readings for the suspend detector.
var epoch = time.Now()

// suspendedSoFar is boot-time minus monotonic time: it grows by the length
// of every suspend.
func suspendedSoFar() (time.Duration, bool) {
	b, ok := bootNow()
	return b - time.Since(epoch), ok
}

const (
	// suspendCheck: how often the renewer compares the two clocks while it
	// holds locks.
	suspendCheck = time.Second
	// suspendJump: how far the boot-time clock must run ahead to count as
	// a suspend.
	suspendJump = 100 * time.Millisecond
)

// bootExpired reports whether the boot-time clock has left l's window;
// r.mu held.
func (l *Lock) bootExpired() bool {
	if l.bootDeadline == 0 {
		return false
	}
	b, ok := bootNow()
	return ok && b >= l.bootDeadline
}

// renewer is the one goroutine per Client that renews every lock the client
// holds and declares a lock lost when its local deadline passes
// (crates/fencelock-core/src/renewer.rs). Each lock has one timer in a
// heap: its next renewal, or its deadline while a renewal is in flight.
// The renewals that come due together go in one request (POST /v1/renew)
// in a goroutine of their own, bounded by a third of the shortest lease, so
// a hung request delays no deadline; a service without that route gets one
// request per lock, as it did before it had one.
type renewer struct {
	c  *Client
	mu sync.Mutex
	h  lockHeap
	// armed is when the renewer looks at the heap again by itself: a timer
	// due later needs no wake-up, which would cost a goroutine switch per
	// acquire. Written by the renewer under mu; zero before its first look.
	armed time.Time
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
	once  sync.Once
	// noBatch is set once the service answered 404 to POST /v1/renew.
	noBatch atomic.Bool
}

// maxRenewBatch is the most leases the service takes in one POST /v1/renew.
const maxRenewBatch = 1000

// maxBatchWindow is the longest a renewal is sent ahead of its time to join
// a batch.
const maxBatchWindow = time.Second

// early: each renewal comes due up to this fraction of its period early,
// at random, so that clients do not renew in lockstep.
const early = 0.1

func newRenewer(c *Client) *renewer {
	r := &renewer{c: c, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	// The suspend detector's baseline is read here, not when the goroutine
	// first runs: under load it may start after the first grant, and a
	// suspend in between would become its baseline and go unnoticed.
	baseline, _ := suspendedSoFar()
	go r.run(baseline)
	return r
}

func (r *renewer) stop() {
	r.once.Do(func() { close(r.quit) })
	<-r.done
}

func (r *renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// period is the renewal period of a lease granted for ttl.
func period(ttl time.Duration) time.Duration { return ttl / 3 }

func jittered(sent time.Time, p time.Duration) time.Time {
	return sent.Add(p - time.Duration(rand.Float64()*early*float64(p)))
}

func (l *Lock) wantedTimer() time.Time {
	if !l.next.IsZero() && l.next.Before(l.deadline) {
		return l.next
	}
	return l.deadline
}

// add schedules a new lock whose grant was requested at sent.
func (r *renewer) add(l *Lock, sent stamp) {
	r.mu.Lock()
	if l.done { // ended (by Close) before it was scheduled
		r.mu.Unlock()
		return
	}
	l.next = jittered(sent.mono, period(l.granted))
	l.timer = l.wantedTimer()
	heap.Push(&r.h, l)
	wake := r.h[0] == l && l.timer.Before(r.armed)
	r.mu.Unlock()
	if wake {
		r.poke()
	}
}

// remove takes l out of the schedule; r.mu held.
func (r *renewer) remove(l *Lock) {
	if l.index >= 0 {
		heap.Remove(&r.h, l.index)
	}
}

// reschedule moves l's timer; r.mu held. Reports whether it is now first.
func (r *renewer) reschedule(l *Lock) bool {
	if l.index < 0 {
		return false
	}
	l.timer = l.wantedTimer()
	heap.Fix(&r.h, l.index)
	return r.h[0] == l
}

func (r *renewer) run(lastSuspended time.Duration) {
	defer close(r.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var lost, batch []*Lock
		r.mu.Lock()
		now := time.Now()
		// Monotonic timers stop during a suspend: after a resume, every
		// lease whose window the boot-time clock has left is lost.
		if s, ok := suspendedSoFar(); ok {
			if s > lastSuspended+suspendJump {
				for i := 0; i < len(r.h); {
					if l := r.h[i]; l.bootExpired() {
						heap.Remove(&r.h, i)
						lost = append(lost, l)
						i = 0
						continue
					}
					i++
				}
			}
			lastSuspended = s
		}
		// Every timer that has come, and at most a batch of those about
		// to: a renewal due within a tenth of its period (at most
		// maxBatchWindow) goes now, with the others, so that many locks
		// cost a few requests rather than one each.
		var seen []*Lock
		upcoming := 0
		for len(r.h) > 0 && !r.h[0].timer.After(now.Add(maxBatchWindow)) {
			l := r.h[0]
			if l.timer.After(now) {
				if upcoming++; upcoming > maxRenewBatch {
					break
				}
			}
			heap.Pop(&r.h)
			if !now.Before(l.deadline) {
				lost = append(lost, l)
				continue
			}
			window := min(time.Duration(early*float64(period(l.granted))), maxBatchWindow)
			if !l.next.IsZero() && !l.next.After(now.Add(window)) && len(batch) < maxRenewBatch {
				l.next = time.Time{} // in flight
				batch = append(batch, l)
			}
			l.timer = l.wantedTimer()
			seen = append(seen, l)
		}
		for _, l := range seen {
			heap.Push(&r.h, l)
		}
		wait := time.Hour
		if len(r.h) > 0 {
			wait = min(r.h[0].timer.Sub(now), suspendCheck)
		}
		armed := now.Add(wait)
		r.armed = armed
		r.mu.Unlock()
		for _, l := range lost {
			r.mu.Lock()
			last := l.lastErr
			r.mu.Unlock()
			if l.finish(&LostError{Key: l.key, Token: l.token, Reason: "deadline", Err: last}) {
				// Hand the lease back as soon as the service answers, so
				// that the next holder need not wait out the TTL.
				r.c.releaseInBackground(l.key, l.owner, l.token, l.mode)
			}
		}
		for len(batch) > 0 {
			if len(batch) == 1 || r.noBatch.Load() {
				for _, l := range batch {
					r.c.bg.Add(1)
					go r.renewInBackground(l)
				}
				break
			}
			chunk := batch[:min(len(batch), maxRenewBatch)]
			batch = batch[len(chunk):]
			r.c.bg.Add(1)
			go r.renewBatchInBackground(chunk)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(time.Until(armed)) // at armed, however long the above took
		select {
		case <-r.quit:
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

func (r *renewer) renewInBackground(l *Lock) {
	defer r.c.bg.Done()
	r.mu.Lock()
	ttl, granted := l.ttl, l.granted
	r.mu.Unlock()
	bound := r.c.timeout
	if granted/3 < bound {
		bound = granted / 3
	}
	if bound < time.Millisecond {
		bound = time.Millisecond
	}
	sent := now()
	g, err := r.c.renew(context.Background(), l, ttl, bound)
	r.settle(l, sent, g, err)
}

type renewItem struct {
	Key   string `json:"key"`
	Owner string `json:"owner"`
	Token uint64 `json:"token"`
	TTLms int64  `json:"ttl_ms"`
	Mode  string `json:"mode,omitempty"`
}

type renewResult struct {
	Status int        `json:"status"`
	Grant  *grantBody `json:"grant"`
	Error  *errorBody `json:"error"`
}

// renewBatchInBackground renews locks in one request and settles each with
// its own outcome, as crates/fencelock-core/src/renewer.rs does with
// Backend::renew_many.
func (r *renewer) renewBatchInBackground(locks []*Lock) {
	defer r.c.bg.Done()
	items := make([]renewItem, len(locks))
	bound := r.c.timeout
	r.mu.Lock()
	for i, l := range locks {
		items[i] = renewItem{Key: l.key, Owner: l.owner, Token: l.token, TTLms: l.ttl.Milliseconds(), Mode: l.mode}
		bound = min(bound, l.granted/3)
	}
	r.mu.Unlock()
	bound = max(bound, time.Millisecond)
	sent := now()
	var answer struct {
		Results []renewResult `json:"results"`
	}
	err := r.c.do(context.Background(), "renew", "", "POST", r.c.path("v1", "renew"),
		struct {
			Leases []renewItem `json:"leases"`
		}{items}, &answer, bound)
	var refusal *Error
	if errors.As(err, &refusal) && refusal.Status == http.StatusNotFound && refusal.Code == "" {
		// A service from before POST /v1/renew: one request per lock from
		// now on.
		r.noBatch.Store(true)
		for _, l := range locks {
			r.c.bg.Add(1)
			go r.renewInBackground(l)
		}
		return
	}
	if err == nil && len(answer.Results) != len(locks) {
		err = &Error{Op: "renew", Message: fmt.Sprintf("the lock service answered %d results for %d renewals",
			len(answer.Results), len(locks))}
	}
	for i, l := range locks {
		if err != nil {
			// No answer for the batch is no answer for each lock.
			r.settle(l, sent, nil, err)
			continue
		}
		res := answer.Results[i]
		if res.Status == http.StatusOK && res.Grant != nil {
			r.settle(l, sent, res.Grant, nil)
			continue
		}
		e := &Error{Op: "renew", Key: l.key, Status: res.Status, Message: "no outcome for this renewal"}
		if res.Error != nil {
			e.Code, e.Message, e.Holder, e.Current = res.Error.Code, res.Error.Error, res.Error.Holder, res.Error.Current
		}
		r.settle(l, sent, nil, e)
	}
}

// settle records the outcome of a renewal sent at sent.
func (r *renewer) settle(l *Lock, sent stamp, g *grantBody, err error) {
	if err != nil && errors.Is(err, ErrNotHeld) {
		l.finish(&LostError{Key: l.key, Token: l.token, Reason: "refused", Err: err})
		return
	}
	r.mu.Lock()
	if l.done {
		r.mu.Unlock()
		return
	}
	if err == nil {
		granted := time.Duration(g.TTLms) * time.Millisecond
		valid := ValidFor(granted)
		if d := sent.mono.Add(valid); d.After(l.deadline) {
			l.deadline = d
			l.bootDeadline = 0
			if sent.bootOK {
				l.bootDeadline = sent.boot + valid
			}
		}
		l.granted = granted
		l.expiresAt = g.ExpiresAt
		l.retryCap = 0
		l.lastErr = nil
		l.next = jittered(sent.mono, period(granted))
	} else {
		// Retry while the lease is trusted, pausing at least half of a cap
		// that doubles from ttl/100 to ttl/10: a dead service costs a
		// bounded number of requests per lease.
		if l.retryCap == 0 {
			l.retryCap = max(l.granted/100, time.Millisecond)
		}
		b := backoff{initial: l.retryCap, max: max(l.granted/10, time.Millisecond), cap: l.retryCap}
		pause := b.retryPause()
		l.retryCap = b.cap
		l.lastErr = err
		l.next = time.Now().Add(pause)
	}
	wake := r.reschedule(l) && l.timer.Before(r.armed)
	r.mu.Unlock()
	if wake {
		r.poke()
	}
}

// lockHeap orders locks by their timer.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].timer.Before(h[j].timer) }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	l.index = -1
	*h = old[:n-1]
	return l
}
