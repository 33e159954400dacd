// Not a test: the figures of docs/benchmarks.md ("Node.js"). Needs the
// release addon (`npm run build:release`), the Rust side built in the same
// profile (`cargo build --release --example cycle`), and `npm install` here.
// Run: node --expose-gc bench/cycle.mjs [ROUNDS] [MILLISECONDS]
import { execFileSync } from 'node:child_process'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import Redis from 'ioredis'
import Redlock from 'redlock'
import { Mutex } from 'redis-semaphore'
// FENCELOCK_PKG=<directory> measures another build of the package (e.g. a
// copy of the previous one, run alternately with this one).
const { connect } = await import(process.env.FENCELOCK_PKG ? path.resolve(process.env.FENCELOCK_PKG, 'index.js') : 'fencelock')

const require = createRequire(import.meta.url)
const { startServer, TARGET } = require('../test/servers.js')
const here = path.dirname(fileURLToPath(import.meta.url))
const rounds = Number(process.argv[2] || 5)
const window = Number(process.argv[3] || 3000)

// This process's CPU time (every thread: the event loop and the addon's
// runtime) per cycle of the last rate() run: less swayed by a loaded
// machine than the rate is.
let lastCpuUs = NaN

async function rate(cycle) {
  const cpu = process.cpuUsage()
  const started = performance.now()
  let cycles = 0
  while (performance.now() - started < window) {
    await cycle()
    cycles++
  }
  const used = process.cpuUsage(cpu)
  lastCpuUs = (used.user + used.system) / cycles
  return cycles / ((performance.now() - started) / 1000)
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

const server = await startServer('redis')
const client = await connect(server.url)
const port = Number(new URL(server.url).port)
const redis = new Redis({ host: '127.0.0.1', port })
const redlock = new Redlock([redis], { retryCount: 0 })
const mutex = new Mutex(redis, 'bench:redis-semaphore', { lockTimeout: 30_000, acquireAttemptsLimit: 1, refreshInterval: 0 })
// PROFILE=debug measures a debug build (both sides alike): to try the script.
const rust = path.join(TARGET, process.env.PROFILE || 'release', 'examples', 'cycle')

const contenders = {
  'Rust library': async () => Number(execFileSync(rust, [server.url, String(window)], { encoding: 'utf8' })),
  // The same loop as a task on the runtime (a service's handlers), where
  // the caller and the connection share a worker: the Rust library's best.
  'Rust library (spawned task)': async () => Number(execFileSync(rust, [server.url, String(window), 'spawned'], { encoding: 'utf8' })),
  'fencelock (Node binding)': () => rate(async () => {
    const guard = await client.acquire('bench:node', { ttl: 30_000 })
    await guard.release()
  }),
  'redlock 5 (one instance)': () => rate(async () => {
    const lock = await redlock.acquire(['bench:redlock'], 30_000)
    await lock.release()
  }),
  "redis-semaphore Mutex": () => rate(async () => {
    await mutex.acquire()
    await mutex.release()
  }),
}

// The server's own time per cycle (the sum of INFO commandstats' usec,
// which counts a script's commands inside its EVALSHA): what each lock
// costs Redis, apart from the client and the machine's load.
async function serverUsec() {
  const stats = await redis.info('commandstats')
  return [...stats.matchAll(/^cmdstat_(\w+):calls=\d+,usec=(\d+)/gm)]
    .filter(([, command]) => command !== 'info' && command !== 'config')
    .reduce((sum, [, , usec]) => sum + Number(usec), 0)
}

const results = Object.fromEntries(Object.keys(contenders).map((name) => [name, []]))
const server_us = Object.fromEntries(Object.keys(contenders).map((name) => [name, []]))
const client_us = Object.fromEntries(Object.keys(contenders).map((name) => [name, []]))
for (let r = 0; r < rounds; r++) {
  for (const [name, run] of Object.entries(contenders)) {
    await redis.config('RESETSTAT')
    lastCpuUs = NaN
    const cyclesPerSecond = await run()
    results[name].push(cyclesPerSecond)
    client_us[name].push(lastCpuUs)
    server_us[name].push((await serverUsec()) / (cyclesPerSecond * window / 1000))
  }
}
const rustRate = median(results['Rust library'])
console.log(`uncontended acquire + release on Redis, one client, median of ${rounds} rounds of ${window} ms`)
for (const [name, rates] of Object.entries(results)) {
  const m = median(rates)
  const range = `${Math.min(...rates).toFixed(0)}-${Math.max(...rates).toFixed(0)}`
  // Each round's ratio to the Rust library's run just before it.
  const ratios = rates.map((rate, r) => rate / results['Rust library'][r])
  const ratioRange = `${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)}`
  console.log(`${name.padEnd(28)} ${m.toFixed(0).padStart(7)} cycles/s (${range})  ${(m / rustRate).toFixed(2)} x Rust (rounds ${ratioRange})  server ${median(server_us[name]).toFixed(1)} us/cycle  client CPU ${median(client_us[name]).toFixed(1)} us/cycle`)
}

// Hand-off: the holder's release() call to the waiter's grant, two clients.
const waiterClient = await connect(server.url)
const latencies = []
for (let i = 0; i < 300; i++) {
  const held = await client.acquire('bench:handoff', { ttl: 30_000 })
  const waiting = waiterClient.acquire('bench:handoff', { ttl: 30_000, wait: Infinity })
  await new Promise((resolve) => setTimeout(resolve, 2)) // the waiter is waiting
  const released = performance.now()
  await held.release()
  const next = await waiting
  latencies.push(performance.now() - released)
  await next.release()
}
console.log(`hand-off p50 ${median(latencies).toFixed(2)} ms (${latencies.length} hand-offs)`)

// Memory per held lock: 10,000 locks held (and renewed) at once.
global.gc?.()
const before = process.memoryUsage()
const guards = []
for (let i = 0; i < 10_000; i += 500) {
  const batch = []
  for (let j = i; j < i + 500; j++) batch.push(client.acquire(`bench:hold:${j}`, { ttl: 30_000 }))
  guards.push(...(await Promise.all(batch)))
}
global.gc?.()
const after = process.memoryUsage()
console.log(`memory per held lock: ${((after.rss - before.rss) / 10_000).toFixed(0)} B RSS, ${((after.heapUsed - before.heapUsed) / 10_000).toFixed(0)} B JS heap`)

// 10,000 releases at once on a loaded machine may outlast the operation
// timeout; those leases then end by expiry, which does not matter here.
await client.close().catch((err) => console.log(`close: ${err.message}`))
await waiterClient.close()
redis.disconnect()
await server.stop()
