'use strict'
// The tests' time budget (test/patience.js) keeps the base figures on a
// quiet machine and scales every figure in proportion on a busy one.
//
// Time: nothing here depends on elapsed time (the samples are given).

const { it } = require('node:test')
const assert = require('node:assert/strict')
const { Patience, fromSamples, MAX_FACTOR } = require('./patience.js')

it('keeps the base figures on a quiet machine and scales them on a busy one', () => {
  const quiet = Patience.of(0, 1)
  assert.equal(quiet.factor, 1)
  assert.equal(quiet.scale(400), 400)
  const busy = Patience.of(20, 1)
  assert.equal(busy.factor, 3)
  assert.equal(busy.scale(2000), 6000)
  assert.equal(busy.duration(400), '1200ms')
  assert.equal(String(busy), 'patience ×3.0 (scheduling delay up to 20ms)')
  assert.equal(String(Patience.of(0.164521, 1)), 'patience ×1.0 (scheduling delay up to 164.521µs)')
  assert.equal(Patience.of(0, 2.5).factor, 2.5)
  assert.equal(Patience.of(60_000, 1).factor, MAX_FACTOR)
  // A record of its own: this process's would keep the burst as the floor.
  const record = { last: null, recent: [] }
  const burst = fromSamples(50, 1, record)
  const after = fromSamples(0, 1, record)
  assert.ok(after.factor >= burst.factor, `${after} after ${burst}`)
})
