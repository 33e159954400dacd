'use strict'
// A measured time budget for tests against real servers, as in the Rust
// test kit (crates/fencelock-testkit/src/patience.rs).
//
// A test against a real server cannot fix its TTLs and bounds, or a busy
// machine fails it: a 400 ms lease whose grant takes 370 ms to come back is
// lost at birth. measurePatience() measures what the machine costs right
// now, at the start of the test: the worst scheduling delay of a few short
// sleeps (setTimeout: the event loop's wait for a core and its timers both
// count). Every TTL, wait and bound the test uses is its *base* figure
// (what a quiet machine needs, with the margins the test always had) times
// the measured factor, so a loaded machine gets longer leases and longer
// bounds instead of a false failure.
//
// - The base figures allow ALLOWANCE_MS of delay. The factor is
//   1 + worst delay / ALLOWANCE_MS, never below 1 (the test keeps its
//   meaning on a quiet machine) and never above MAX_FACTOR (a test still
//   ends).
// - Load comes in bursts that a measurement of a few milliseconds can fall
//   between, so a factor measured in the same process within the last
//   15 s is the floor of the next one.
// - FENCELOCK_TEST_PATIENCE=F sets a floor under the factor, for a machine
//   known to be slow (a debugger, an emulator).
// - A test that still fails names its budget: a patience shows as
//   `patience ×2.3 (scheduling delay up to 18ms)`.
//
// A figure a test would *report* (a latency, a rate) is no business of this
// module: those belong in the benchmarks (bench/), never in an assertion.
//
// Time: this module is the tests' time budget; it asserts nothing itself.

/** The delay the base figures of the tests allow for, in ms. */
const ALLOWANCE_MS = 10
/** The largest factor: beyond it the machine is not running tests but thrashing. */
const MAX_FACTOR = 16
/** Short sleeps timed to find the scheduling delay. */
const SLEEPS = 16
/** The floor's variable. */
const FLOOR_VAR = 'FENCELOCK_TEST_PATIENCE'
/** How long a measured factor stays the floor of later measurements, in ms. */
const MEMORY_MS = 15_000

/** What this process measured: the last budget, and each measurement's own factor. */
const measured = { last: null, recent: [] }

const clamp = (factor) => (Number.isNaN(factor) ? 1 : Math.min(Math.max(factor, 1), MAX_FACTOR))

/** A duration in ms as Rust's Debug shows one: 18.5ms, 164.521µs, 1.2s. */
function shown(ms) {
  const trim = (n) => String(Number(n.toFixed(6)))
  if (ms >= 1000) return `${trim(ms / 1000)}s`
  if (ms >= 1) return `${trim(ms)}ms`
  return `${trim(ms * 1000)}µs`
}

class Patience {
  /** A budget of `factor` (clamped to 1–MAX_FACTOR) after a delay of `schedulingMs`. */
  constructor(factor, schedulingMs = 0) {
    this.factor = clamp(factor)
    this.schedulingMs = schedulingMs
  }

  /** The budget of this delay and floor, remembering nothing. */
  static of(schedulingMs, floor) {
    return new Patience(Math.max(1 + schedulingMs / ALLOWANCE_MS, floor), schedulingMs)
  }

  /** A figure (a TTL, a wait, a bound) whose base is `baseMs`, in whole ms: never less than the base. */
  scale(baseMs) {
    return Math.ceil(baseMs * this.factor)
  }

  /** scale(baseMs) as a duration string (`'2300ms'`), for options and the CLI. */
  duration(baseMs) {
    return `${this.scale(baseMs)}ms`
  }

  /**
   * Polls `condition` (may be async) every few ms until it is true; rejects
   * naming `what` and the budget when it still is not after scale(baseMs):
   * how a test waits for a condition instead of sleeping and hoping.
   */
  async waitFor(baseMs, what, condition) {
    const bound = this.scale(baseMs)
    const until = performance.now() + bound
    while (!(await condition())) {
      if (performance.now() > until) throw new Error(`${what}: not within ${bound} ms [${this}]`)
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
  }

  toString() {
    return `patience ×${this.factor.toFixed(1)} (scheduling delay up to ${shown(this.schedulingMs)})`
  }
}

/** FENCELOCK_TEST_PATIENCE, or 1. */
function floor() {
  const value = Number.parseFloat((process.env[FLOOR_VAR] || '').trim())
  return Number.isFinite(value) ? value : 1
}

/**
 * The budget of this delay, no less than `floorFactor` and than the factor
 * `record` holds from within MEMORY_MS; it becomes the last.
 */
function fromSamples(schedulingMs, floorFactor, record = measured) {
  const now = performance.now()
  // The sample's own factor is remembered, not the floored one, so that a
  // burst's factor is forgotten after MEMORY_MS.
  const own = Patience.of(schedulingMs, 1).factor
  record.recent = record.recent.filter((m) => now - m.at < MEMORY_MS)
  const recent = record.recent.reduce((worst, m) => Math.max(worst, m.factor), 1)
  record.recent.push({ at: now, factor: own })
  record.last = Patience.of(schedulingMs, Math.max(floorFactor, recent))
  return record.last
}

/** Measures the budget now: the worst overshoot of SLEEPS sleeps of 1 ms. */
async function measurePatience() {
  let worst = 0
  for (let i = 0; i < SLEEPS; i++) {
    const asked = 1
    const started = performance.now()
    await new Promise((resolve) => setTimeout(resolve, asked))
    worst = Math.max(worst, performance.now() - started - asked)
  }
  return fromSamples(worst, floor())
}

/** The last budget this process measured, else a factor of 1 (or the floor). */
function currentPatience() {
  return measured.last || new Patience(floor())
}

module.exports = { Patience, measurePatience, currentPatience, fromSamples, ALLOWANCE_MS, MAX_FACTOR }
