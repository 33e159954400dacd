package fencelock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// LockManager is the interface of the Go Redis lock package fencelock
// replaces. Manager implements it over a Client, so code written against
// it switches with one line: NewManager(client) where it made its manager.
type LockManager interface {
	TryLock(ctx context.Context, key string, ttl time.Duration) (bool, error)
	Lock(ctx context.Context, key string, ttl time.Duration) error
	Unlock(ctx context.Context, key string) error
	Renew(ctx context.Context, key string, ttl time.Duration) error
	IsLocked(ctx context.Context, key string) (bool, error)
	GetFencingToken(ctx context.Context, key string) (uint64, error)
}

// Manager holds at most one Lock per key for a process, renewed in the
// background by the Client. Use Held for the Lock itself (its Context
// says when the lock is lost).
type Manager struct {
	c     *Client
	mu    sync.Mutex
	locks map[string]*Lock
}

var _ LockManager = (*Manager)(nil)

// NewManager makes a LockManager over c.
func NewManager(c *Client) *Manager { return &Manager{c: c, locks: make(map[string]*Lock)} }

func (m *Manager) held(key string) *Lock {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.locks[key]
	if l != nil && l.Context().Err() != nil {
		delete(m.locks, key)
		return nil
	}
	return l
}

func (m *Manager) keep(l *Lock) {
	m.mu.Lock()
	m.locks[l.Key()] = l
	m.mu.Unlock()
}

// TryLock makes one attempt: false (and no error) when key is held,
// including by this manager.
func (m *Manager) TryLock(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	if m.held(key) != nil {
		return false, nil
	}
	l, err := m.c.TryAcquire(ctx, key, TTL(ttl))
	if errors.Is(err, ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m.keep(l)
	return true, nil
}

// Lock waits for key until ctx is done.
func (m *Manager) Lock(ctx context.Context, key string, ttl time.Duration) error {
	l, err := m.c.Acquire(ctx, key, TTL(ttl))
	if err != nil {
		return err
	}
	m.keep(l)
	return nil
}

// Unlock releases key; ErrNotHeld when this manager does not hold it.
func (m *Manager) Unlock(ctx context.Context, key string) error {
	m.mu.Lock()
	l := m.locks[key]
	delete(m.locks, key)
	m.mu.Unlock()
	if l == nil {
		return &Error{Op: "unlock", Key: key, Code: "not_held", Message: "this manager does not hold the lock"}
	}
	return l.Release(ctx)
}

// Renew renews key now for ttl (later renewals ask ttl too). The renewer
// already renews in the background: calling it is never required.
func (m *Manager) Renew(ctx context.Context, key string, ttl time.Duration) error {
	l := m.held(key)
	if l == nil {
		return &Error{Op: "renew", Key: key, Code: "not_held", Message: "this manager does not hold the lock"}
	}
	if ttl > 0 {
		m.c.renewer.mu.Lock()
		l.ttl = ttl
		m.c.renewer.mu.Unlock()
	}
	return l.Renew(ctx)
}

// IsLocked reports whether anyone holds key (asks the service).
func (m *Manager) IsLocked(ctx context.Context, key string) (bool, error) {
	_, err := m.c.Inspect(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// GetFencingToken is the token of this manager's lock on key.
func (m *Manager) GetFencingToken(ctx context.Context, key string) (uint64, error) {
	l := m.held(key)
	if l == nil {
		return 0, &Error{Op: "token", Key: key, Code: "not_held", Message: "this manager does not hold the lock"}
	}
	return l.Token(), nil
}

// Held is this manager's Lock on key, or nil.
func (m *Manager) Held(key string) *Lock { return m.held(key) }
