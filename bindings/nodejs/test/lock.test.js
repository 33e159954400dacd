'use strict'
// The binding against real servers the tests start (test/servers.js):
// SQLite, Redis and PostgreSQL, and the Rust CLI on the same keys.
//
// Time: (b) every TTL that must outlast a test's steps (the CLI's too)
// and every wait that must be long enough is a base figure scaled by the
// patience measured at the test's start (test/patience.js). The one bound
// asserted, that an unreachable host fails rather than hangs, scales its
// base of 15 s.

const { describe, it, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, openFence, NotAcquiredError, InvalidInputError, FencelockError, StaleTokenError, LockLostError } = require('..')
const { startServer, cli } = require('./servers.js')
const { measurePatience } = require('./patience.js')

const tokenOf = (stdout) => {
  const m = /token=(\d+) owner=(\S+)/.exec(stdout)
  assert.ok(m, `no token in ${JSON.stringify(stdout)}`)
  return { token: BigInt(m[1]), owner: m[2] }
}

for (const engine of ['sqlite', 'redis', 'postgres']) {
  describe(engine, () => {
    let server
    before(async () => { server = await startServer(engine) })
    after(async () => { await server.stop() })

    it('excludes the Rust CLI and is excluded by it, with growing tokens both ways', async () => {
      const patience = await measurePatience()
      const ttl = patience.duration(30_000)
      const client = await connect(server.url)
      const first = await client.acquire('interop', { ttl, wait: 0 })
      const refused = await cli(server.url, 'acquire', 'interop', '--ttl', ttl)
      assert.equal(refused.code, 75, `${refused.stderr} [${patience}]`)
      await first.release()

      const byCli = await cli(server.url, 'acquire', 'interop', '--ttl', ttl)
      assert.equal(byCli.code, 0, byCli.stderr)
      const held = tokenOf(byCli.stdout)
      assert.ok(held.token > first.token, `${held.token} after ${first.token}`)
      await assert.rejects(client.acquire('interop', { ttl: 1000, wait: 0 }), (err) => {
        assert.ok(err instanceof NotAcquiredError, `${err} [${patience}]`)
        assert.equal(err.code, 'not_acquired')
        return true
      })
      const released = await cli(server.url, 'release', 'interop', '--owner', held.owner, '--token', String(held.token))
      assert.equal(released.code, 0, released.stderr)

      const next = await client.acquire('interop', { ttl: 30_000, wait: patience.duration(5_000) })
      assert.ok(next.token > held.token, `${next.token} after ${held.token}`)
      assert.equal(typeof next.token, 'bigint')
      assert.equal(next.owner, client.owner)
      await next.release()
      await client.close()
    })

    it('gives typed errors for bad input, never a crash or a hang', async () => {
      const client = await connect(server.url)
      const cases = [
        [() => client.acquire('', { ttl: 1000 }), 'invalid_key'],
        [() => client.acquire('k', { ttl: 0 }), 'invalid_ttl'],
        [() => client.acquire('k', { ttl: 'soon' }), 'invalid_ttl'],
        [() => client.acquire('k', { ttl: -5 }), 'invalid_ttl'],
        [() => client.acquire('k', { wait: Number.NaN }), 'bad_request'],
        [() => client.acquire('k', { wait: -1 }), 'bad_request'],
        [() => client.acquire('k', { wait: '-1s' }), 'bad_request'],
        [() => client.acquire('k', { owner: '' }), 'invalid_owner'],
        [() => connect('no-scheme'), 'bad_request'],
        [() => connect('nosuch://x'), 'bad_request'],
      ]
      for (const [attempt, code] of cases) {
        await assert.rejects(attempt(), (err) => {
          assert.ok(err instanceof InvalidInputError, `${err}`)
          assert.equal(err.code, code, err.message)
          return true
        })
      }
      // A long input is quoted shortened, not whole.
      for (const [attempt, code] of [
        [() => client.acquire('k'.repeat(10_000)), 'invalid_key'],
        [() => client.acquire('k', { wait: 'w'.repeat(10_000) }), 'bad_request'],
        [() => client.acquire('k', { ttl: 't'.repeat(10_000) }), 'invalid_ttl'],
      ]) {
        await assert.rejects(attempt(), (err) => {
          assert.equal(err.code, code, err.message.slice(0, 300))
          assert.ok(err.message.length < 300, `${err.message.length} characters: ${err.message.slice(0, 300)}`)
          return true
        })
      }
      await client.close()
    })

    it('a released guard is no longer valid, and says it was released', async () => {
      const client = await connect(server.url)
      const guard = await client.acquire('released', { ttl: '30s' })
      assert.equal(guard.isValid, true)
      await guard.release()
      assert.equal(guard.isValid, false)
      assert.equal(guard.remainingMs, 0)
      assert.equal(guard.lossReason, null)
      const released = (err) => {
        assert.ok(err instanceof LockLostError, `${err}`)
        assert.equal(err.code, 'not_held')
        assert.match(err.message, /released/)
        assert.doesNotMatch(err.message, /lost/)
        return true
      }
      assert.throws(() => guard.check(), released)
      await assert.rejects(guard.renew(), released)
      await guard.release() // a second release does nothing
      await client.close()
    })

    it('close() releases every lock, signals the loss and refuses new locks', async () => {
      const patience = await measurePatience()
      const client = await connect(server.url)
      // Long enough that the next holder gets them by the release, never by expiry.
      const ttl = patience.duration(60_000)
      const guards = await Promise.all(['a', 'b', 'c'].map((k) => client.acquire(`close:${k}`, { ttl })))
      await client.close()
      for (const guard of guards) assert.equal(await guard.lost, 'closed')
      const other = await connect(server.url)
      for (const guard of guards) {
        const next = await other.acquire(guard.key, { ttl: '5s', wait: 0 })
        assert.ok(next.token > guard.token, `${next.token} after ${guard.token} [${patience}]`)
      }
      await assert.rejects(client.acquire('close:d'), (err) => err instanceof FencelockError && err.code === 'unavailable')
      await other.close()
    })

    it('runs work under the lock and releases it', async () => {
      const patience = await measurePatience()
      const client = await connect(server.url)
      const fence = await openFence(server.url)
      const token = await client.run('run:k', { ttl: patience.duration(10_000) }, async (signal, guard) => {
        assert.equal(signal.aborted, false, `${patience}`)
        await fence.admit('run:resource', guard.token)
        return guard.token
      })
      assert.equal(await client.inspect('run:k'), null)
      await assert.rejects(fence.admit('run:resource', token - 1n), StaleTokenError)
      await client.close()
    })
  })
}

describe('unreachable host', () => {
  it('rejects with a typed error within the wait', async () => {
    const patience = await measurePatience()
    // Far beyond the wait (1 s) and the operation timeout (2 s), far short
    // of a hang.
    const bound = patience.scale(15_000)
    const started = Date.now()
    await assert.rejects(
      (async () => {
        const client = await connect('redis://127.0.0.1:1', { opTimeout: '2s' })
        await client.acquire('k', { ttl: '5s', wait: '1s' })
      })(),
      (err) => {
        assert.ok(err instanceof FencelockError, `${err}`)
        assert.ok(['unavailable', 'timeout', 'not_acquired'].includes(err.code), err.code)
        return true
      },
    )
    const took = Date.now() - started
    assert.ok(took < bound, `took ${took} ms, more than ${bound} ms [${patience}]`)
  })
})
