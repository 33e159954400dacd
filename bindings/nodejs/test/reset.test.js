'use strict'
// fence.reset, the operator's repair of a fence, on SQLite and Redis, and
// through `fencelock serve` over the same store: an http:// fence resets
// only with the admin token, and a value of the fenced store is forgotten
// with its token.

const { describe, it, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, openFence, StaleTokenError, UnauthorizedError } = require('..')
const { startServer, startService, ADMIN_TOKEN, CLIENT_TOKEN } = require('./servers.js')

// Takes `key` `n` times on the store at `url` and returns the tokens it
// issued, lowest first: the service's fenced store shares that store and
// refuses tokens it never issued.
async function issued(url, key, n) {
  const client = await connect(url, { owner: 'issuer' })
  try {
    const tokens = []
    for (let i = 0; i < n; i++) {
      const guard = await client.acquire(key, { ttl: '10s' })
      tokens.push(guard.token)
      await guard.release()
    }
    return tokens
  } finally {
    await client.close()
  }
}

for (const engine of ['sqlite', 'redis']) {
  describe(`fence reset on ${engine}`, () => {
    let server
    let service
    before(async () => {
      server = await startServer(engine)
      // The service's fence is the one openFence(server.url) opens.
      service = await startService(server.url)
    })
    after(async () => {
      await service.stop()
      await server.stop()
    })

    it('forgets the tokens, so that a lower token is admitted again', async () => {
      const fence = await openFence(server.url)
      assert.equal(await fence.reset('reset:fresh'), null, 'nothing admitted: nothing to forget')
      await fence.admit('reset:r', 5n)
      await fence.admit('reset:r', 9n)
      await assert.rejects(fence.admit('reset:r', 6n), StaleTokenError)

      assert.equal(await fence.reset('reset:r'), 9n)
      await fence.admit('reset:r', 6n) // below the forgotten 9: admitted again
      await assert.rejects(fence.admit('reset:r', 4n), StaleTokenError)
      assert.equal(await fence.reset('reset:r'), 6n)
      assert.equal(await fence.reset('reset:r'), null)

      // A reader's token is forgotten too, and answered when it is the highest.
      await fence.admit('reset:rw', 3n)
      await fence.admitShared('reset:rw', 8n)
      assert.equal(await fence.reset('reset:rw'), 8n)
      await fence.admit('reset:rw', 2n)
    })

    it('forgets the value stored with the token; through the service only with the admin token', async () => {
      const route = '/v1/kv/reset:kv'
      const [low, high] = await issued(server.url, 'reset:kv', 2)
      let answer = await service.request('PUT', route, CLIENT_TOKEN, { token: Number(high), value: { v: 1 } })
      assert.equal(answer.status, 200, JSON.stringify(answer.body))
      answer = await service.request('GET', route, CLIENT_TOKEN)
      assert.deepEqual([answer.status, answer.body.token, answer.body.value], [200, Number(high), { v: 1 }])

      const direct = await openFence(server.url)
      assert.equal(await direct.reset('reset:kv'), high)
      answer = await service.request('GET', route, CLIENT_TOKEN)
      assert.deepEqual([answer.status, answer.body.code], [404, 'not_found'])
      answer = await service.request('PUT', route, CLIENT_TOKEN, { token: Number(low), value: 'again' })
      assert.equal(answer.status, 200, 'the lower token writes again')

      // A client token on the admin's route: the service's 403.
      const client = await openFence(service.fenceUrl(CLIENT_TOKEN))
      await assert.rejects(
        client.reset('reset:kv'),
        (err) => err instanceof UnauthorizedError && err.code === 'unauthorized' && /403 Forbidden/.test(err.message),
      )
      answer = await service.request('GET', route, CLIENT_TOKEN)
      assert.deepEqual([answer.status, answer.body.value], [200, 'again'], 'a refused reset forgets nothing')

      const admin = await openFence(service.fenceUrl(ADMIN_TOKEN))
      assert.equal(await admin.reset('reset:kv'), low)
      assert.equal(await admin.reset('reset:kv'), null)
      answer = await service.request('GET', route, CLIENT_TOKEN)
      assert.equal(answer.status, 404)
      await direct.admit('reset:kv', 1n)
    })
  })
}
