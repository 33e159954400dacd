package fencelock

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Election is a leader election over a lock (docs/election.md): the leader
// of election NAME holds the key fencelock/election/NAME and its term is
// that lease's fencing token, as with `fencelock elect` and the Rust
// library, which it interoperates with.
type Election struct {
	c    *Client
	name string
}

// Election is the election name.
func (c *Client) Election(name string) *Election { return &Election{c: c, name: name} }

// Key is the lock key of the election.
func (e *Election) Key() string { return "fencelock/election/" + e.name }

// Leader is who leads an election.
type Leader struct {
	Owner string
	// Value is the JSON published with the leadership (the Data option
	// of Campaign), if any.
	Value json.RawMessage
	// Term is the leader's fencing token.
	Term      uint64
	ExpiresIn time.Duration
}

// LeaderChange is one change of an election: Leader is nil when the
// election fell vacant (the previous term released, expired or was
// force-released).
type LeaderChange struct {
	Leader       *Leader
	PreviousTerm uint64
	Expired      bool
}

// Campaign waits as a standby (as Acquire: until the Wait option or ctx)
// and returns the leadership as a Lock: Token is the term, Context ends
// with the leadership, Release resigns. Data(v) publishes a value.
func (e *Election) Campaign(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return e.c.Acquire(ctx, e.Key(), opts...)
}

// Run campaigns, runs fn while leader, and resigns after (Client.Run).
func (e *Election) Run(ctx context.Context, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
	return e.c.Run(ctx, e.Key(), fn, opts...)
}

// Leader is the current leader, nil when the election is vacant.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	info, err := e.c.Inspect(ctx, e.Key())
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return leaderOf(info), nil
}

func leaderOf(info *LockInfo) *Leader {
	l := &Leader{Owner: info.Owner, Term: info.Token, ExpiresIn: time.Duration(info.ExpiresInMs) * time.Millisecond}
	if len(info.Data) > 0 && string(info.Data) != "null" {
		l.Value = info.Data
	}
	return l
}

// Observe sends the current state (the leader, or a vacancy), then every
// change, from the service's event stream, until ctx is done or the
// stream ends (the channel is then closed).
func (e *Election) Observe(ctx context.Context) (<-chan LeaderChange, error) {
	ctx, cancel := context.WithCancel(ctx)
	events, err := e.c.Events(ctx, EventFilter{Key: e.Key()})
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan LeaderChange, 4)
	go func() {
		defer close(out)
		// Deferred in this order: cancel ends the stream, then the drain
		// waits for its reader.
		defer func() {
			for range events {
			}
		}()
		defer cancel()
		send := func(ch LeaderChange) bool {
			select {
			case out <- ch:
				return true
			case <-ctx.Done():
				return false
			}
		}
		var term uint64
		current := func() bool {
			l, err := e.Leader(ctx)
			if err != nil {
				return false
			}
			if l == nil {
				return send(LeaderChange{PreviousTerm: term})
			}
			term = l.Term
			return send(LeaderChange{Leader: l})
		}
		if !current() {
			return
		}
		for ev := range events {
			switch ev.Type {
			case "acquired":
				if ev.Token <= term {
					continue
				}
				if ev.Lock != nil {
					term = ev.Token
					if !send(LeaderChange{Leader: leaderOf(ev.Lock)}) {
						return
					}
				} else if !current() {
					return
				}
			case "released", "expired", "lost":
				if ev.Token < term {
					continue
				}
				term = ev.Token
				if !send(LeaderChange{PreviousTerm: ev.Token, Expired: ev.Type == "expired"}) {
					return
				}
			case "resync":
				if !current() {
					return
				}
			}
		}
	}()
	return out, nil
}
