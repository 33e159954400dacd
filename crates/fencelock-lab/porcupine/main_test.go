package main

import "testing"

// op builds a register operation of worker w on the one counter.
func op(w int, kind string, token uint64, value int64, admitted bool, call, ret int64) registerOp {
	return registerOp{Resource: "c", Client: w, Op: kind, Token: token, Value: value, Admitted: admitted, Call: call, Ret: ret}
}

func check(t *testing.T, h history) (bool, bool) {
	t.Helper()
	registerOk, tokensOk, err := verdict(&h, 0)
	if err != nil {
		t.Fatal(err)
	}
	return registerOk, tokensOk
}

// A fenced run: worker 0 is refused after worker 1 (newer token) wrote.
func TestFencedHistoryIsLinearizable(t *testing.T) {
	h := history{
		Register: []registerOp{
			op(0, "admit", 1, 0, true, 1, 1), op(0, "read", 1, 0, true, 2, 2),
			op(1, "admit", 2, 0, true, 3, 3), op(1, "read", 2, 0, true, 4, 4),
			op(1, "write", 2, 0, true, 5, 6), op(0, "write", 1, 0, false, 5, 7),
			op(-1, "read", 0, 1, true, 8, 8),
		},
		Grants: []grantOp{{Resource: "c", Client: 0, Token: 1, Call: 0, Ret: 1}, {Resource: "c", Client: 1, Token: 2, Call: 2, Ret: 3}},
	}
	if registerOk, tokensOk := check(t, h); !registerOk || !tokensOk {
		t.Fatalf("register %v tokens %v", registerOk, tokensOk)
	}
}

// Unfenced: both read 0 and both writes of 1 are admitted.
func TestLostUpdateIsNotLinearizable(t *testing.T) {
	h := history{Register: []registerOp{
		op(0, "read", 1, 0, true, 1, 1), op(1, "read", 2, 0, true, 2, 2),
		op(1, "write", 2, 0, true, 3, 4), op(0, "write", 1, 0, true, 5, 6),
	}}
	if registerOk, _ := check(t, h); registerOk {
		t.Fatal("a lost update passed")
	}
}

// A write under token 1 admitted after token 2 was: stale.
func TestStaleWriteIsNotLinearizable(t *testing.T) {
	h := history{Register: []registerOp{
		op(1, "admit", 2, 0, true, 1, 1), op(0, "write", 1, 0, true, 2, 3),
	}}
	if registerOk, _ := check(t, h); registerOk {
		t.Fatal("a stale write passed")
	}
}

// A final counter below the admitted increments.
func TestCounterMismatchIsNotLinearizable(t *testing.T) {
	h := history{Register: []registerOp{
		op(0, "write", 1, 0, true, 1, 2), op(-1, "read", 0, 0, true, 3, 3),
	}}
	if registerOk, _ := check(t, h); registerOk {
		t.Fatal("a lost increment passed")
	}
}

// Token 1 granted after token 2 completed; concurrent grants may come in
// either order.
func TestTokenOrder(t *testing.T) {
	regressed := history{Grants: []grantOp{{Resource: "c", Token: 2, Call: 0, Ret: 1}, {Resource: "c", Client: 1, Token: 1, Call: 2, Ret: 3}}}
	if _, tokensOk := check(t, regressed); tokensOk {
		t.Fatal("a token regression passed")
	}
	concurrent := history{Grants: []grantOp{{Resource: "c", Token: 2, Call: 0, Ret: 3}, {Resource: "c", Client: 1, Token: 1, Call: 1, Ret: 2}}}
	if _, tokensOk := check(t, concurrent); !tokensOk {
		t.Fatal("concurrent grants were ordered")
	}
}
