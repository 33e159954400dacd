package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	fencelock "fencelock/clients/go"
)

// Take a lock, fence the resource with its token, and stop when the lock
// is lost. (Needs a running `fencelock serve`.)
func Example() {
	c, err := fencelock.NewClient("http://127.0.0.1:7878") // token: $FENCELOCK_HTTP_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	l, err := c.Acquire(ctx, "invoice:42", fencelock.TTL(30*time.Second), fencelock.Wait(5*time.Second))
	if errors.Is(err, fencelock.ErrNotAcquired) {
		log.Print("someone else is on it")
		return
	} else if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)

	// Admit the token before reading what will be modified.
	if err := c.Fence("invoice:42").Admit(l.Context(), l.Token()); err != nil {
		log.Fatal(err) // ErrStale: a newer holder exists
	}
	select {
	case <-l.Context().Done(): // lost: stop acting on the resource
		log.Print(context.Cause(l.Context()))
	case <-time.After(time.Second): // the work
	}
}

// Run the work under the lock; its context ends if the lock is lost.
func ExampleClient_Run() {
	c, err := fencelock.NewClient("http://127.0.0.1:7878")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Run(context.Background(), "reports/nightly", func(ctx context.Context, l *fencelock.Lock) error {
		return c.KVPut(ctx, "reports/nightly", l.Token(), map[string]string{"state": "done"})
	}, fencelock.TTL(10*time.Second))
	if errors.Is(err, fencelock.ErrLost) {
		log.Print("lost the lock mid-way: the work may be partial")
	}
}

// TryAcquire makes one attempt; a held lock is ErrNotAcquired with the
// holder in the *Error.
func ExampleClient_TryAcquire() {
	c, err := fencelock.NewClient("http://127.0.0.1:7878")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "cron/cleanup")
	var e *fencelock.Error
	if errors.As(err, &e) && e.Holder != nil {
		fmt.Printf("held by %s (token %d)\n", e.Holder.Owner, e.Holder.Token)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
}

// Code written against the LockManager interface switches with one line.
func ExampleNewManager() {
	c, err := fencelock.NewClient("http://127.0.0.1:7878")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var m fencelock.LockManager = fencelock.NewManager(c) // was: redislock.New(rdb)
	ctx := context.Background()
	if ok, err := m.TryLock(ctx, "orders:7", 10*time.Second); err != nil || !ok {
		return
	}
	defer m.Unlock(ctx, "orders:7")
	token, _ := m.GetFencingToken(ctx, "orders:7")
	fmt.Println("writing with token", token)
}

// Errors carry the service's code and match the package's sentinels.
func ExampleError() {
	// What Acquire returns when the service answers 409 "held".
	var err error = &fencelock.Error{Op: "acquire", Key: "k", Status: 409, Code: "held", Message: "lock k is held"}
	fmt.Println(errors.Is(err, fencelock.ErrNotAcquired), errors.Is(err, fencelock.ErrStale))

	err = fmt.Errorf("saving: %w", &fencelock.Error{Op: "admit", Key: "doc", Status: 409, Code: "stale", Message: "token 3 < 5"})
	var e *fencelock.Error
	fmt.Println(errors.Is(err, fencelock.ErrStale), errors.As(err, &e) && e.Code == "stale")

	err = &fencelock.LostError{Key: "k", Token: 7, Reason: "deadline"}
	fmt.Println(errors.Is(err, fencelock.ErrLost))
	fmt.Println(err)
	// Output:
	// true false
	// true true
	// true
	// fencelock: lock "k" (token 7) lost: deadline
}

// How long a lease is trusted after its request was sent (I5).
func ExampleValidFor() {
	fmt.Println(fencelock.ValidFor(30 * time.Second))
	fmt.Println(fencelock.ValidFor(time.Second))
	// Output:
	// 29.2s
	// 890ms
}
