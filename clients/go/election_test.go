package fencelock

// Time: (b) the leases, waits and bounds are base figures scaled by the
// test's measured patience (patience_test.go); the standby is waited for
// on its event stream, not given a sleep to get there.

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

func TestElection(t *testing.T) {
	pat := measurePatience()
	s := startService(t, "sqlite", false)
	a := newClient(t, s.url)
	b := newClient(t, s.url)
	streams := eventStreams(b)
	ctx := ctxT(t, pat.scale(30*time.Second))
	ea, eb := a.Election("scheduler"), b.Election("scheduler")
	changes, err := eb.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ch := <-changes; ch.Leader != nil {
		t.Fatalf("first change %+v, want vacant", ch)
	}
	lead, err := ea.Campaign(ctx, TTL(pat.scale(2*time.Second)), Data(map[string]string{"addr": "10.0.0.1:80"}))
	if err != nil {
		t.Fatal(err)
	}
	ch := <-changes
	if ch.Leader == nil || ch.Leader.Term != lead.Token() {
		t.Fatalf("observed %+v, want term %d [%v]", ch, lead.Token(), pat)
	}
	l, err := eb.Leader(ctx)
	var v map[string]string
	if err != nil || l == nil || l.Term != lead.Token() || json.Unmarshal(l.Value, &v) != nil || v["addr"] != "10.0.0.1:80" {
		t.Fatalf("leader %+v %v", l, err)
	}
	// A standby is elected when the leader resigns, with a higher term.
	// The standby waits on its own event stream once it found the term
	// held (Observe opened one already).
	observing := streams()
	standby := make(chan *Lock, 1)
	go func() {
		l, err := eb.Campaign(ctx, TTL(pat.scale(2*time.Second)), Wait(pat.scale(10*time.Second)))
		if err != nil {
			t.Errorf("standby: %v [%v]", err, pat)
		}
		standby <- l
	}()
	pat.waitFor(t, 10*time.Second, "the standby waiting on its event stream", func() bool { return streams() > observing })
	if err := lead.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-standby
	if next == nil || next.Token() <= lead.Token() {
		t.Fatalf("standby %v after term %d [%v]", next, lead.Token(), pat)
	}
	if ch := <-changes; ch.Leader != nil || ch.PreviousTerm != lead.Token() {
		t.Fatalf("observed %+v, want vacancy after %d [%v]", ch, lead.Token(), pat)
	}
	if ch := <-changes; ch.Leader == nil || ch.Leader.Term != next.Token() {
		t.Fatalf("observed %+v, want term %d [%v]", ch, next.Token(), pat)
	}
	// Interoperates with the CLI: `fencelock leader` sees the Go leader.
	code, out := cli(t, nil, "--url", s.url, "leader", "scheduler", "--json")
	var cl struct {
		Term uint64 `json:"term"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &cl) != nil || cl.Term != next.Token() {
		t.Fatalf("fencelock leader: exit %d %q", code, out)
	}
	_ = next.Release(context.Background())
}
