package main

import "testing"

// op builds a register operation of worker w on the one counter.
func op(w int, kind string, token uint64, value int64, admitted bool, call, ret int64) registerOp {
	return registerOp{Resource: "c", Client: w, Op: kind, Token: token, Value: value, Admitted: admitted, Call: call, Ret: ret}
}

func check(t *testing.T, h history) (bool, bool) {
	t.Helper()
	v := verdictOf(t, h)
	return v.register, v.tokens
}

func verdictOf(t *testing.T, h history) verdicts {
	t.Helper()
	v, err := verdict(&h, 0)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// hold builds worker w's hold of token on the one counter: requested at
// call, granted at ret, trusted until end.
func hold(w int, token uint64, call, ret, end int64) holdOp {
	return holdOp{Resource: "c", Client: w, Token: token, Call: call, Ret: ret, End: end}
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

// A run's holds as the fence sees them: worker 1 asked while worker 0 held
// and was granted after worker 0's trust ended at its deadline (paused
// past it), then worker 2 after worker 1 released; on another counter,
// worker 3 at the same time.
func TestSuccessiveHoldsAreLinearizable(t *testing.T) {
	h := history{Holds: []holdOp{
		hold(0, 1, 0, 5, 40), hold(1, 2, 10, 50, 60), hold(2, 3, 55, 61, 70),
		{Resource: "other", Client: 3, Token: 1, Call: 0, Ret: 20, End: 65},
	}}
	if v := verdictOf(t, h); !v.holds {
		t.Fatal("successive holds were found overlapping")
	}
}

// A history edited so that worker 1's grant (token 2) is answered while
// worker 0 still trusts token 1: tokens increase, the register is fine,
// and two workers hold at once.
func TestOverlappingTrustedIntervalsAreNotLinearizable(t *testing.T) {
	h := history{
		Register: []registerOp{
			op(0, "admit", 1, 0, true, 6, 6), op(0, "read", 1, 0, true, 7, 7),
			op(0, "write", 1, 0, true, 8, 9),
			op(1, "admit", 2, 0, true, 31, 31), op(1, "read", 2, 1, true, 32, 32),
			op(1, "write", 2, 1, true, 33, 34),
		},
		Grants: []grantOp{{Resource: "c", Client: 0, Token: 1, Call: 0, Ret: 5}, {Resource: "c", Client: 1, Token: 2, Call: 10, Ret: 30}},
		Holds:  []holdOp{hold(0, 1, 0, 5, 40), hold(1, 2, 10, 30, 50)},
	}
	v := verdictOf(t, h)
	if !v.register || !v.tokens {
		t.Fatalf("the edit was meant to keep register and tokens legal: %+v", v)
	}
	if v.holds {
		t.Fatal("two overlapping trusted intervals passed")
	}
	// One nested inside the other, and three where only the middle one
	// overlaps its neighbours.
	nested := history{Holds: []holdOp{hold(0, 1, 0, 5, 100), hold(1, 2, 10, 20, 30)}}
	if verdictOf(t, nested).holds {
		t.Fatal("a hold nested in another passed")
	}
	chain := history{Holds: []holdOp{hold(0, 1, 0, 5, 20), hold(1, 2, 6, 30, 50), hold(2, 3, 25, 45, 60)}}
	if verdictOf(t, chain).holds {
		t.Fatal("a chain of overlapping holds passed")
	}
}
