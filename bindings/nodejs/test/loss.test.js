'use strict'
// Loss before expiry (docs/semantics.md, I5): the Redis server is paused
// past the TTL; the binding gets the Rust client's loss deadline.

const { describe, it, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, LockLostError } = require('..')
const { startServer } = require('./servers.js')

describe('redis paused past the TTL', () => {
  let server
  before(async () => { server = await startServer('redis') })
  after(async () => { await server.stop() })

  it('signals the loss before the lease ends, aborts run, and the next token is higher', async () => {
    const ttl = 2000
    const client = await connect(server.url, { opTimeout: '500ms' })
    const guard = await client.acquire('loss:k', { ttl })
    const granted = Date.now()
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
    const lostAfter = Date.now() - granted
    assert.ok(lostAfter < ttl, `lost after ${lostAfter} ms, not before the ${ttl} ms lease ended`)
    assert.equal(reason, 'deadline')
    assert.deepEqual(events, ['deadline'])
    assert.equal(guard.isValid, false)
    assert.throws(() => guard.check(), LockLostError)
    await assert.rejects(running, (err) => err instanceof LockLostError && err.code === 'not_held')
    assert.equal(signal.aborted, true)
    assert.ok(signal.reason instanceof LockLostError)

    await server.command('resume')
    const other = await connect(server.url)
    const next = await other.acquire('loss:k', { ttl, wait: '10s' })
    assert.ok(next.token > guard.token, `${next.token} after ${guard.token}`)
    await next.release()
    await other.close()
    await client.close()
  })
})
