'use strict'
// Errors cross from the native half as structured values (src/errors.rs):
// each code has its class, the message is the Rust error's own text, and
// the same holds for a rejection, a synchronous throw and an argument the
// native half refuses before any backend call.
//
// Time: (b) the one lease a test needs held across its steps has a TTL
// scaled by the patience measured at its start (test/patience.js); the
// other leases are released at once or refused. Nothing asserts a time.

const { describe, it, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { execFile } = require('node:child_process')
const {
  connect,
  FencelockError,
  InvalidInputError,
  LockLostError,
  UnavailableError,
  ClientClosedError,
  TokensExhaustedError,
  NotAcquiredError,
} = require('..')
const { startServer } = require('./servers.js')
const { measurePatience } = require('./patience.js')

/** The last fencing token a counter can give (2^53 − 1). */
const LAST_TOKEN = 2n ** 53n - 1n

function redisCli(url, ...args) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['-u', url, ...args], (error, stdout, stderr) => {
      if (error) reject(new Error(`redis-cli ${args.join(' ')}: ${stderr || error.message}`))
      else resolve(stdout.trim())
    })
  })
}

describe('errors from the native half', () => {
  let server
  let client
  before(async () => {
    server = await startServer('sqlite')
    client = await connect(server.url, { owner: 'errors' })
  })
  after(async () => {
    await client.close()
    await server.stop()
  })

  it('a rejection carries its class, code and the error text', async () => {
    const err = await client.acquire('', { ttl: '10s' }).then(() => null, (e) => e)
    assert.ok(err instanceof InvalidInputError, String(err))
    assert.equal(err.code, 'invalid_key')
    assert.equal(err.name, 'InvalidInputError')
    assert.doesNotMatch(err.message, /^fencelock:/)
    assert.match(err.message, /key/)
  })

  it('an option the native half refuses is its typed error', async () => {
    const err = await client.acquire('k', { ttl: 'soon' }).then(() => null, (e) => e)
    assert.ok(err instanceof InvalidInputError, String(err))
    assert.equal(err.code, 'invalid_ttl')
    assert.match(err.message, /"soon" is not a duration/)
  })

  it('a synchronous throw is typed too', async () => {
    const guard = await client.acquire('sync', { ttl: '10s' })
    await guard.release()
    assert.throws(() => guard.check(), (err) => err instanceof LockLostError && err.code === 'not_held')
  })

  it('a held key is NotAcquiredError', async () => {
    const patience = await measurePatience()
    const guard = await client.acquire('held', { ttl: patience.duration(10_000) })
    const other = await connect(server.url, { owner: 'other' })
    try {
      await assert.rejects(
        other.acquire('held', { wait: 0 }),
        (err) => err instanceof NotAcquiredError && err.code === 'not_acquired',
        `${patience}`,
      )
    } finally {
      await other.close()
      await guard.release()
    }
  })

  it('a closed client is ClientClosedError, an UnavailableError', async () => {
    const closed = await connect(server.url)
    await closed.close()
    const err = await closed.acquire('after', { ttl: '10s' }).then(() => null, (e) => e)
    assert.ok(err instanceof ClientClosedError, String(err))
    assert.ok(err instanceof UnavailableError)
    assert.ok(err instanceof FencelockError)
    assert.equal(err.code, 'unavailable')
  })
})

describe('a counter at its last token', () => {
  let server
  let client
  before(async () => {
    server = await startServer('redis')
    client = await connect(server.url)
  })
  after(async () => {
    await client.close()
    await server.stop()
  })

  it('is TokensExhaustedError after the last grant', async () => {
    await redisCli(server.url, 'SET', 'fencelock:{order:1}:token', String(LAST_TOKEN - 1n))
    const last = await client.acquire('order:1', { ttl: '10s' })
    assert.equal(last.token, LAST_TOKEN)
    await last.release()
    const err = await client.acquire('order:1', { ttl: '10s' }).then(() => null, (e) => e)
    assert.ok(err instanceof TokensExhaustedError, String(err))
    assert.equal(err.code, 'tokens_exhausted')
  })
})
