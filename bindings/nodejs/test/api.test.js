'use strict'
// The rest of the API on SQLite and Redis: semaphores, read-write locks,
// lockAll, elections, fences, inspect/list/stats/forceRelease/cleanup.
//
// Time: (b) every lease a test needs held across its steps (TTL) and every
// wait that must be long enough is a base figure scaled by the patience
// measured before each test (test/patience.js); nothing asserts a time.

const { describe, it, before, beforeEach, after } = require('node:test')
const assert = require('node:assert/strict')
const { connect, openFence, NotAcquiredError, StaleTokenError, InvalidInputError, LockLostError, Leadership } = require('..')
const { startServer } = require('./servers.js')
const { measurePatience } = require('./patience.js')

for (const engine of ['sqlite', 'redis']) {
  describe(engine, () => {
    let server
    let client
    let other
    let patience
    // A lease held across a test's steps: 10 s on a quiet machine.
    let ttl
    before(async () => {
      server = await startServer(engine)
      client = await connect(server.url, { owner: 'one' })
      other = await connect(server.url, { owner: 'two' })
    })
    beforeEach(async () => {
      patience = await measurePatience()
      ttl = patience.duration(10_000)
    })
    after(async () => {
      await client.close()
      await other.close()
      await server.stop()
    })

    it('semaphores grant at most their permits', async () => {
      const a = await client.semaphore('sem', 2, { ttl })
      const b = await other.semaphore('sem', 2, { ttl })
      assert.notEqual(a.slot, b.slot)
      await assert.rejects(other.semaphore('sem', 2, { ttl, wait: 0 }), NotAcquiredError)
      await a.release()
      const c = await other.semaphore('sem', 2, { ttl, wait: 0 })
      await Promise.all([b.release(), c.release()])
    })

    it('read-write locks share reads and exclude writes', async () => {
      const r1 = await client.readLock('rw', { ttl })
      const r2 = await other.readLock('rw', { ttl })
      assert.equal(r1.mode, 'shared')
      await assert.rejects(other.writeLock('rw', { ttl, wait: 0 }), NotAcquiredError)
      await Promise.all([r1.release(), r2.release()])
      const w = await other.writeLock('rw', { ttl, wait: 0 })
      assert.equal(w.mode, 'exclusive')
      await w.release()
    })

    it('lockAll takes every key or none', async () => {
      const blocker = await other.acquire('multi:b', { ttl })
      await assert.rejects(client.lockAll(['multi:a', 'multi:b'], { ttl, wait: 0 }), NotAcquiredError)
      assert.equal(await client.inspect('multi:a'), null)
      await blocker.release()
      const all = await client.lockAll(['multi:a', 'multi:b'], { ttl })
      assert.deepEqual(Object.keys(all.tokens).sort(), ['multi:a', 'multi:b'])
      assert.ok(all.tokens['multi:b'] > blocker.token)
      all.check()
      await all.release()
      assert.equal(await client.inspect('multi:a'), null)
    })

    it('elections have one leader whose term is a token', async () => {
      const election = client.election('leader', { ttl, value: { addr: 'a' } })
      const leadership = await election.campaign()
      const leader = await other.election('leader').leader()
      assert.equal(leader.owner, 'one')
      assert.deepEqual(leader.value, { addr: 'a' })
      assert.equal(leader.term, leadership.token)
      await leadership.release()
      const next = await other.election('leader', { wait: patience.duration(5_000) }).campaign()
      assert.ok(next.token > leadership.token, `${next.token} after ${leadership.token} [${patience}]`)
      await next.release()
    })

    it('observes the leader and its changes', async () => {
      const watcher = other.election('observed')
      const changes = (await watcher.observe())[Symbol.asyncIterator]()
      const leadership = await client.election('observed', { ttl }).campaign()
      const elected = (await changes.next()).value
      assert.equal(elected.kind, 'elected')
      assert.equal(elected.leader.owner, 'one')
      assert.equal(elected.leader.term, leadership.token)
      await leadership.release()
      const vacant = (await changes.next()).value
      assert.equal(vacant.kind, 'vacant')
      assert.equal(vacant.previousTerm, leadership.token)
      assert.equal(vacant.expired, false)
      assert.deepEqual(await changes.return(), { done: true, value: undefined })
    })

    it('watch() and observe() are async iterables without an await', async () => {
      const watched = other.watch('iterated')
      await watched // in place: the acquisition below is seen
      const guard = await client.acquire('iterated', { ttl })
      for await (const change of watched) {
        assert.equal(change.kind, 'acquired')
        assert.equal(change.token, guard.token)
        break
      }
      await guard.release()
      const leadership = await client.election('iterated', { ttl }).campaign()
      for await (const change of other.election('iterated').observe()) {
        assert.equal(change.kind, 'elected')
        assert.equal(change.leader.term, leadership.token)
        break
      }
      await leadership.release()
      await assert.rejects(async () => {
        for await (const change of other.watch('')) void change
      }, (err) => err.code === 'invalid_key')
    })

    it('a leader proclaims its value, and no longer once it resigned', async () => {
      const leadership = await client.election('proclaimed', { ttl, value: 'a' }).campaign()
      assert.ok(leadership instanceof Leadership)
      assert.equal(leadership.term, leadership.token)
      await leadership.proclaim({ addr: 'b' })
      assert.deepEqual((await other.election('proclaimed').leader()).value, { addr: 'b' })
      await leadership.resign()
      await assert.rejects(leadership.proclaim('c'), LockLostError)
      assert.equal(await other.election('proclaimed').leader(), null)
    })

    it('Election.run campaigns again after a loss and resigns when fn returns', async () => {
      const election = client.election('supervised', { ttl: patience.duration(3_000) })
      const terms = []
      const aborted = []
      const value = await election.run(async (signal, leadership) => {
        terms.push(leadership.term)
        if (terms.length === 1) {
          // Deposed from outside: the signal must abort, then run campaigns again.
          await other.forceRelease('fencelock/election/supervised')
          await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }))
          aborted.push(signal.reason)
          return 'first'
        }
        return 'second'
      })
      assert.equal(value, 'second')
      assert.equal(terms.length, 2)
      assert.ok(terms[1] > terms[0])
      assert.ok(aborted[0] instanceof LockLostError)
      assert.equal(await other.election('supervised').leader(), null)
    })

    it('watches the holders of a key', async () => {
      const changes = (await other.watch('watched'))[Symbol.asyncIterator]()
      const guard = await client.acquire('watched', { ttl })
      const acquired = (await changes.next()).value
      assert.equal(acquired.kind, 'acquired')
      assert.equal(acquired.owner, 'one')
      assert.equal(acquired.token, guard.token)
      assert.equal(acquired.lease.key, 'watched')
      await guard.release()
      const released = (await changes.next()).value
      assert.equal(released.kind, 'released')
      assert.equal(released.token, guard.token)
      assert.deepEqual(await changes.return(), { done: true, value: undefined })
    })

    it('resumes a detached lease by key, owner and token', async () => {
      const guard = await client.acquire('resumed', { ttl })
      await guard.detach()
      assert.equal((await other.inspect('resumed')).token, guard.token)
      await assert.rejects(other.resume('resumed', 'one', guard.token + 1n), LockLostError)
      const again = await other.resume('resumed', 'one', guard.token, { ttl })
      assert.equal(again.token, guard.token)
      assert.equal(again.owner, 'one')
      again.check()
      await again.release()
      assert.equal(await other.inspect('resumed'), null)
    })

    it('fences refuse stale tokens and admit readers alike', async () => {
      const fence = await openFence(server.url)
      await fence.admit('fenced', 5n)
      await assert.rejects(fence.admit('fenced', 4n), (err) => err instanceof StaleTokenError && err.code === 'stale')
      await fence.admitShared('fenced-rw', 7n)
      await fence.admitShared('fenced-rw', 7n)
      await assert.rejects(fence.admit('fenced', -1n), InvalidInputError)
    })

    it('inspects, lists, counts and force-releases', async () => {
      const guard = await client.acquire('admin:k', { ttl, kind: 'job', data: { n: 1 } })
      const info = await other.inspect('admin:k')
      assert.equal(info.owner, 'one')
      assert.equal(info.kind, 'job')
      assert.deepEqual(info.data, { n: 1 })
      assert.equal(info.token, guard.token)
      assert.ok(info.expiresAt instanceof Date)
      assert.deepEqual((await other.list('admin:')).map((l) => l.key), ['admin:k'])
      const stats = await other.stats()
      assert.ok(stats.held >= 1)
      assert.ok(stats.heldByKind.job >= 1)
      const ended = await other.forceRelease('admin:k')
      assert.equal(ended.token, guard.token)
      assert.equal(await guard.lost, 'refused', `${patience}`)
      assert.equal(typeof (await other.cleanup()), 'number')
    })
  })
}
