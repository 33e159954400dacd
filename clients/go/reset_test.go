package fencelock

// Time: (b) the test's only figure, its context's bound, is scaled by its
// measured patience (patience_test.go).

import (
	"errors"
	"testing"
	"time"
)

// A fence's reset (Fence.Reset, KVReset) is the admin's: a client token is
// refused and forgets nothing; the admin's reset forgets the tokens and the
// stored value, after which a lower token is admitted again; a fence that
// admitted nothing answers ok == false.
func TestResetIsTheAdminsAndForgetsTokensAndValue(t *testing.T) {
	for _, backend := range []string{"sqlite", "redis"} {
		t.Run(backend, func(t *testing.T) {
			pat := measurePatience()
			s := startService(t, backend, true)
			c := newClient(t, s.url, WithToken(clientToken))
			admin := newClient(t, s.url, WithToken(adminToken))
			ctx := ctxT(t, pat.scale(20*time.Second))

			// Tokens the store issued: a fence that shares it refuses others.
			p := issuedTokens(t, ctx, c, "printer", 3)
			if err := c.Fence("printer").Admit(ctx, p[2]); err != nil {
				t.Fatal(err)
			}
			if err := c.Fence("printer").Admit(ctx, p[1]); !errors.Is(err, ErrStale) {
				t.Fatalf("stale admission before the reset: %v", err)
			}
			refused := func(what string, err error) {
				t.Helper()
				var e *Error
				if !errors.Is(err, ErrForbidden) || !errors.As(err, &e) || e.Code != "forbidden" || e.Status != 403 {
					t.Errorf("%s with a client token: %v, want ErrForbidden (403 forbidden)", what, err)
				}
			}
			_, _, err := c.Fence("printer").Reset(ctx)
			refused("Fence.Reset", err)
			if cur, ok, err := c.Fence("printer").Current(ctx); err != nil || !ok || cur != p[2] {
				t.Errorf("after a refused reset: %d %v %v, want %d", cur, ok, err, p[2])
			}

			if had, ok, err := admin.Fence("printer").Reset(ctx); err != nil || !ok || had != p[2] {
				t.Fatalf("admin reset: %d %v %v, want %d", had, ok, err, p[2])
			}
			if cur, ok, err := c.Fence("printer").Current(ctx); err != nil || ok {
				t.Errorf("current after the reset: %d %v %v, want none", cur, ok, err)
			}
			if err := c.Fence("printer").Admit(ctx, p[1]); err != nil {
				t.Errorf("a lower token after the reset: %v", err)
			}
			if err := c.Fence("printer").Admit(ctx, p[0]); !errors.Is(err, ErrStale) {
				t.Errorf("the fence holds again after the reset: %v", err)
			}
			if had, ok, err := admin.Fence("never-admitted").Reset(ctx); err != nil || ok || had != 0 {
				t.Errorf("reset of an unknown fence: %d %v %v, want none", had, ok, err)
			}

			// The fenced store: its value goes with its fence's tokens.
			d := issuedTokens(t, ctx, c, "doc", 2)
			if err := c.KVPut(ctx, "doc", d[1], map[string]int{"v": 1}); err != nil {
				t.Fatal(err)
			}
			_, _, err = c.KVReset(ctx, "doc")
			refused("KVReset", err)
			if v, err := c.KVGet(ctx, "doc"); err != nil || v.Token != d[1] {
				t.Errorf("kv get after a refused reset: %+v %v", v, err)
			}
			if had, ok, err := admin.KVReset(ctx, "doc"); err != nil || !ok || had != d[1] {
				t.Fatalf("admin kv reset: %d %v %v, want %d", had, ok, err, d[1])
			}
			if _, err := c.KVGet(ctx, "doc"); !errors.Is(err, ErrNotFound) {
				t.Errorf("kv get after the reset: %v, want ErrNotFound", err)
			}
			if err := c.KVPut(ctx, "doc", d[0], "again"); err != nil {
				t.Errorf("a lower token writes after the reset: %v", err)
			}
			// A fence's reset forgets the value stored under its name too.
			if had, ok, err := admin.Fence("doc").Reset(ctx); err != nil || !ok || had != d[0] {
				t.Errorf("admin fence reset of a stored value: %d %v %v, want %d", had, ok, err, d[0])
			}
			if _, err := c.KVGet(ctx, "doc"); !errors.Is(err, ErrNotFound) {
				t.Errorf("kv get after the fence's reset: %v, want ErrNotFound", err)
			}
			if had, ok, err := admin.KVReset(ctx, "doc"); err != nil || ok || had != 0 {
				t.Errorf("a second kv reset: %d %v %v, want none", had, ok, err)
			}

			// A name the service refuses is ErrInvalid, for either route.
			for _, err := range []error{
				func() error { _, _, err := admin.Fence("bad\x01name").Reset(ctx); return err }(),
				func() error { _, _, err := admin.KVReset(ctx, "bad\x01name"); return err }(),
			} {
				var e *Error
				if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Code != "invalid_key" {
					t.Errorf("reset of a bad name: %v, want ErrInvalid (invalid_key)", err)
				}
			}
		})
	}
}
