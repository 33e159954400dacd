'use strict'
// Loss before expiry (docs/semantics.md, I5): the Redis server is paused
// past the TTL; the binding gets the Rust client's loss deadline.
//
// Time: (b) the TTL, the operation timeout and the wait are base figures
// scaled by the patience measured at the test's start (test/patience.js).
// "Lost before the lease ended" is checked against the lease's end as the
// backend last reported it (guard.expiresAt, on this machine's clock),
// not against the first grant plus the TTL, which a renewal before the
// pause (however late the pause comes) moves on.

const { describe, it, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, LockLostError } = require('..')
const { startServer } = require('./servers.js')
const { measurePatience } = require('./patience.js')

describe('redis paused past the TTL', () => {
  let server
  before(async () => { server = await startServer('redis') })
  after(async () => { await server.stop() })

  it('signals the loss before the lease ends, aborts run, and the next token is higher', async () => {
    const patience = await measurePatience()
    const ttl = patience.scale(2000)
    const client = await connect(server.url, { opTimeout: patience.duration(500) })
    const guard = await client.acquire('loss:k', { ttl })
    const events = []
    guard.on('lost', (reason) => events.push(reason))

    let signal
    const running = client.run('loss:run', { ttl }, (s) => {
      signal = s
      return new Promise((resolve) => s.addEventListener('abort', () => resolve('aborted')))
    })
    // run has its lock once its function was called.
    while (signal === undefined) await new Promise((resolve) => setImmediate(resolve))

    await server.command('pause')
    const reason = await guard.lost
    const lostAt = Date.now()
    // The end of the last grant the backend confirmed: a renewal it took
    // but whose answer the pause held back only ends the lease later.
    const ends = guard.expiresAt.getTime()
    assert.ok(lostAt < ends, `lost ${lostAt - ends} ms after the lease ended [${patience}]`)
    assert.equal(reason, 'deadline', `${patience}`)
    assert.deepEqual(events, ['deadline'])
    assert.equal(guard.isValid, false)
    assert.throws(() => guard.check(), LockLostError)
    await assert.rejects(running, (err) => err instanceof LockLostError && err.code === 'not_held')
    assert.equal(signal.aborted, true)
    assert.ok(signal.reason instanceof LockLostError)

    await server.command('resume')
    const other = await connect(server.url)
    const next = await other.acquire('loss:k', { ttl, wait: patience.duration(10_000) })
    assert.ok(next.token > guard.token, `${next.token} after ${guard.token}`)
    await next.release()
    await other.close()
    await client.close()
  })
})
