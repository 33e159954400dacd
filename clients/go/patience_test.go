package fencelock

// Time: this file is the tests' time budget; it asserts nothing itself.

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// patience is a measured time budget for tests against real servers, as
// in the Rust test kit (crates/fencelock-testkit/src/patience.rs).
//
// A test against a real server cannot fix its TTLs and bounds, or a busy
// machine fails it: a 400 ms lease whose grant takes 370 ms to come back is
// lost at birth. measurePatience measures what the machine costs right
// now, at the start of the test: the worst scheduling delay of a few short
// sleeps. Every TTL, wait and bound the test uses is its *base* figure
// (what a quiet machine needs, with the margins the test always had) times
// the measured factor, so a loaded machine gets longer leases and longer
// bounds instead of a false failure.
//
//   - The base figures allow patienceAllowance of delay. The factor is
//     1 + worst delay / patienceAllowance, never below 1 (the test keeps
//     its meaning on a quiet machine) and never above patienceMaxFactor (a
//     test still ends).
//   - Load comes in bursts that a measurement of a few milliseconds can
//     fall between, so a factor measured in the same process within the
//     last 15 s is the floor of the next one.
//   - FENCELOCK_TEST_PATIENCE=F sets a floor under the factor, for a
//     machine known to be slow (a debugger, an emulator).
//   - A test that still fails names its budget: a patience prints as
//     "patience ×2.3 (scheduling delay up to 18ms)".
//
// A figure a test would *report* (a latency, a rate) is no business of
// this budget: those belong in the benchmarks (bench_test.go), never in an
// assertion.
type patience struct {
	factor     float64
	scheduling time.Duration
}

const (
	// patienceAllowance is the delay the base figures of the tests allow
	// for: a scheduling delay up to this costs a test nothing.
	patienceAllowance = 10 * time.Millisecond
	// patienceMaxFactor is the largest factor: beyond it the machine is not
	// running tests but thrashing, and a test that waited that long would
	// not end.
	patienceMaxFactor = 16.0
	// patienceSleeps is how many short sleeps are timed.
	patienceSleeps = 16
	// patienceFloorVar is the floor's variable.
	patienceFloorVar = "FENCELOCK_TEST_PATIENCE"
	// patienceMemory is how long a measured factor stays the floor of later
	// measurements in the same process.
	patienceMemory = 15 * time.Second
)

// patienceRecord is what a process measured: the last budget, for helpers
// that are not handed one (currentPatience), and each measurement's own
// factor within patienceMemory, the floor of the next one.
type patienceRecord struct {
	sync.Mutex
	last   *patience
	recent []measuredFactor
}

// measuredPatience is this process's record.
var measuredPatience patienceRecord

type measuredFactor struct {
	at     time.Time
	factor float64
}

// measurePatience measures the scheduling delay: the worst overshoot of
// patienceSleeps sleeps of 1 ms.
func measurePatience() patience {
	var worst time.Duration
	for i := 0; i < patienceSleeps; i++ {
		const asked = time.Millisecond
		started := time.Now()
		time.Sleep(asked)
		worst = max(worst, time.Since(started)-asked)
	}
	return measuredPatience.fromSamples(worst, patienceFloor())
}

// fixedPatience is a budget of exactly factor (1 to patienceMaxFactor).
func fixedPatience(factor float64) patience {
	return patience{factor: clampFactor(factor)}
}

// fromSamples is the budget of this delay, no less than floor and than
// the factor r recorded within patienceMemory; it becomes the last.
func (r *patienceRecord) fromSamples(scheduling time.Duration, floor float64) patience {
	r.Lock()
	defer r.Unlock()
	// The sample's own factor is remembered, not the floored one, so that
	// a burst's factor is forgotten after patienceMemory.
	own := patienceOf(scheduling, 1).factor
	recent := 1.0
	kept := r.recent[:0]
	for _, m := range r.recent {
		if time.Since(m.at) < patienceMemory {
			kept = append(kept, m)
			recent = math.Max(recent, m.factor)
		}
	}
	r.recent = append(kept, measuredFactor{at: time.Now(), factor: own})
	p := patienceOf(scheduling, math.Max(floor, recent))
	r.last = &p
	return p
}

// patienceOf is the budget of this delay and floor, remembering nothing.
func patienceOf(scheduling time.Duration, floor float64) patience {
	measured := 1 + scheduling.Seconds()/patienceAllowance.Seconds()
	return patience{factor: clampFactor(math.Max(measured, floor)), scheduling: scheduling}
}

func clampFactor(f float64) float64 {
	if math.IsNaN(f) {
		return 1
	}
	return math.Min(math.Max(f, 1), patienceMaxFactor)
}

// currentPatience is the last budget this process measured, else a factor
// of 1 (or the floor): for helpers (startService, cli) that no test hands
// its budget.
func currentPatience() patience {
	measuredPatience.Lock()
	last := measuredPatience.last
	measuredPatience.Unlock()
	if last != nil {
		return *last
	}
	return fixedPatience(patienceFloor())
}

// patienceFloor is $FENCELOCK_TEST_PATIENCE, or 1.
func patienceFloor() float64 {
	f, err := strconv.ParseFloat(strings.TrimSpace(os.Getenv(patienceFloorVar)), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 1
	}
	return f
}

// scale is the figure (a TTL, a wait, a bound) whose base is base on this
// machine now: base times the factor, never less than base, rounded up to
// the millisecond (the service counts leases in whole milliseconds, and a
// fraction of one would be granted a shade less than asked).
func (p patience) scale(base time.Duration) time.Duration {
	scaled := time.Duration(float64(base) * p.factor)
	return (scaled + time.Millisecond - 1).Truncate(time.Millisecond)
}

func (p patience) String() string {
	return fmt.Sprintf("patience ×%.1f (scheduling delay up to %v)", p.factor, p.scheduling)
}

// waitFor polls cond every few milliseconds until it holds, and fails the
// test naming what and the budget when it still does not after base
// scaled: how a test waits for a condition instead of sleeping and
// hoping it holds by then.
func (p patience) waitFor(t testing.TB, base time.Duration, what string, cond func() bool) {
	t.Helper()
	bound := p.scale(base)
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v [%v]", what, bound, p)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPatienceScalesEveryFigureAndKeepsTheBaseOnAQuietMachine(t *testing.T) {
	quiet := patienceOf(0, 1)
	if quiet.factor != 1 || quiet.scale(400*time.Millisecond) != 400*time.Millisecond {
		t.Fatalf("quiet: %v", quiet)
	}
	busy := patienceOf(20*time.Millisecond, 1)
	if math.Abs(busy.factor-3) > 1e-9 || busy.scale(2*time.Second) != 6*time.Second {
		t.Fatalf("busy: %v", busy)
	}
	if s := busy.String(); s != "patience ×3.0 (scheduling delay up to 20ms)" {
		t.Fatalf("shown as %q", s)
	}
	if floored := patienceOf(0, 2.5); floored.factor != 2.5 {
		t.Fatalf("floored: %v", floored)
	}
	if thrashing := patienceOf(time.Minute, 1); thrashing.factor != patienceMaxFactor {
		t.Fatalf("thrashing: %v", thrashing)
	}
	// A record of its own: a burst in this process's would be the floor of
	// the other tests' budgets for 15 s.
	var record patienceRecord
	burst := record.fromSamples(50*time.Millisecond, 1)
	if after := record.fromSamples(0, 1); after.factor < burst.factor {
		t.Fatalf("%v after %v", after, burst)
	}
}
