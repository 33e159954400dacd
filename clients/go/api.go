package fencelock

import (
	"context"
	"encoding/json"
	"net/url"
	"time"
)

// Fence is a fenced resource of the service (POST /v1/fences/{resource}).
type Fence struct {
	c        *Client
	resource string
}

// Fence is the service's fence for resource: it admits a token only if no
// higher one was admitted (I7).
func (c *Client) Fence(resource string) *Fence { return &Fence{c: c, resource: resource} }

type fenceBody struct {
	Resource string  `json:"resource"`
	Current  *uint64 `json:"current"`
}

// Admit admits token at the fence; a higher token admitted before makes
// it fail with ErrStale (the *Error's Current says which). Admit before
// reading what you will modify.
func (f *Fence) Admit(ctx context.Context, token uint64) error {
	return f.c.do(ctx, "admit", f.resource, "POST", f.c.path("v1", "fences", f.resource, "admit"),
		map[string]uint64{"token": token}, nil, 0)
}

// Current is the highest token admitted; ok is false before any admission.
func (f *Fence) Current(ctx context.Context) (token uint64, ok bool, err error) {
	var b fenceBody
	if err := f.c.do(ctx, "fence", f.resource, "GET", f.c.path("v1", "fences", f.resource), nil, &b, 0); err != nil {
		return 0, false, err
	}
	if b.Current == nil {
		return 0, false, nil
	}
	return *b.Current, true, nil
}

// Reset forgets the fence (admin token, DELETE /v1/fences/{resource}): its
// highest tokens and the value stored under its name in the fenced store,
// in one step of the service's store, so that a lower token is admitted
// again. token is the highest it had admitted, in either mode; ok is
// false when it had admitted none. It is the operator's repair of a fence
// that a token no grant issued has blocked, never a step of a holder's
// protocol. ErrForbidden for a client token.
func (f *Fence) Reset(ctx context.Context) (token uint64, ok bool, err error) {
	return f.c.reset(ctx, "reset", f.resource, f.c.path("v1", "fences", f.resource))
}

type resetBody struct {
	Resource string  `json:"resource"`
	Had      *uint64 `json:"had"`
}

func (c *Client) reset(ctx context.Context, op, name, u string) (uint64, bool, error) {
	var b resetBody
	if err := c.do(ctx, op, name, "DELETE", u, nil, &b, 0); err != nil {
		return 0, false, err
	}
	if b.Had == nil {
		return 0, false, nil
	}
	return *b.Had, true, nil
}

// KV is a value of the service's fenced key-value store.
type KV struct {
	Key   string          `json:"key"`
	Token uint64          `json:"token"`
	Value json.RawMessage `json:"value"`
}

// KVPut writes value (any JSON value) under key with token: the service
// admits token at the fence named key and stores the value in one step;
// ErrStale when a higher token was admitted or written.
func (c *Client) KVPut(ctx context.Context, key string, token uint64, value any) error {
	return c.do(ctx, "kv put", key, "PUT", c.path("v1", "kv", key),
		struct {
			Token uint64 `json:"token"`
			Value any    `json:"value"`
		}{token, value}, nil, 0)
}

// KVGet reads key from the fenced store (ErrNotFound without a value).
func (c *Client) KVGet(ctx context.Context, key string) (*KV, error) {
	var v KV
	if err := c.do(ctx, "kv get", key, "GET", c.path("v1", "kv", key), nil, &v, 0); err != nil {
		return nil, err
	}
	return &v, nil
}

// KVReset forgets key in the fenced store (admin token, DELETE
// /v1/kv/{key}): its value and the tokens of the fence named key, the
// reset Fence(key).Reset makes, so that a lower token writes again. token
// is the highest the fence had admitted; ok is false when it had admitted
// none. ErrForbidden for a client token.
func (c *Client) KVReset(ctx context.Context, key string) (token uint64, ok bool, err error) {
	return c.reset(ctx, "kv reset", key, c.path("v1", "kv", key))
}

// Inspect shows the lease on key (ErrNotFound when it is free).
func (c *Client) Inspect(ctx context.Context, key string) (*LockInfo, error) {
	var info LockInfo
	if err := c.do(ctx, "inspect", key, "GET", c.path("v1", "locks", key), nil, &info, 0); err != nil {
		return nil, err
	}
	return &info, nil
}

// List shows the unexpired leases whose keys start with prefix, by key.
func (c *Client) List(ctx context.Context, prefix string) ([]LockInfo, error) {
	u := c.path("v1", "locks")
	if prefix != "" {
		u += "?prefix=" + url.QueryEscape(prefix)
	}
	var b struct {
		Locks []LockInfo `json:"locks"`
	}
	if err := c.do(ctx, "list", prefix, "GET", u, nil, &b, 0); err != nil {
		return nil, err
	}
	return b.Locks, nil
}

// ForceRelease ends whoever holds key (admin token): its holder loses it
// at its next renewal. ErrNotFound when free, ErrForbidden for a client
// token.
func (c *Client) ForceRelease(ctx context.Context, key string) (*LockInfo, error) {
	var b struct {
		Removed LockInfo `json:"removed"`
	}
	if err := c.do(ctx, "force-release", key, "DELETE", c.path("v1", "locks", key), nil, &b, 0); err != nil {
		return nil, err
	}
	return &b.Removed, nil
}

// ReleaseAll releases every lease of owner (in the caller's namespace).
func (c *Client) ReleaseAll(ctx context.Context, owner string) (uint64, error) {
	var b struct {
		Released uint64 `json:"released"`
	}
	err := c.do(ctx, "release-all", owner, "POST", c.path("v1", "owners", owner, "release"), nil, &b, 0)
	return b.Released, err
}

// Cleanup deletes expired records (admin token).
func (c *Client) Cleanup(ctx context.Context) (uint64, error) {
	var b struct {
		Deleted uint64 `json:"deleted"`
	}
	err := c.do(ctx, "cleanup", "", "POST", c.path("v1", "cleanup"), nil, &b, 0)
	return b.Deleted, err
}

// Stats are the service's figures (GET /v1/stats).
type Stats struct {
	Held              uint64            `json:"held"`
	HeldByKind        map[string]uint64 `json:"held_by_kind"`
	HeldByOwner       map[string]uint64 `json:"held_by_owner"`
	AvgHoldSeconds    float64           `json:"avg_hold_seconds"`
	MaxHoldSeconds    float64           `json:"max_hold_seconds"`
	ExpiredNotCleaned uint64            `json:"expired_not_cleaned"`
	Waiters           uint64            `json:"waiters"`
}

// Stats reads GET /v1/stats.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	var s Stats
	if err := c.do(ctx, "stats", "", "GET", c.path("v1", "stats"), nil, &s, 0); err != nil {
		return nil, err
	}
	return &s, nil
}

// Info is what the service's backend is and can do (GET /v1/info).
type Info struct {
	Backend      string          `json:"backend"`
	Capabilities map[string]bool `json:"capabilities"`
}

// Info reads GET /v1/info.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var i Info
	if err := c.do(ctx, "info", "", "GET", c.path("v1", "info"), nil, &i, 0); err != nil {
		return nil, err
	}
	return &i, nil
}

// Health is nil once the service's backend answers a read (GET /healthz).
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, "healthz", "", "GET", c.path("healthz"), nil, nil, 5*time.Second)
}
