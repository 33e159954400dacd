// Compiled with `tsc --strict` (test/tsconfig.json) against the shipped
// index.d.ts and the generated native.d.ts, then run by typed.test.js.
import {
  connect,
  openFence,
  FencelockError,
  NotAcquiredError,
  UnavailableError,
  ClientClosedError,
  type ErrorCode,
  type Guard,
  type KeyChange,
  type Leadership,
  type LossReason,
} from 'fencelock'

export async function main(url: string): Promise<bigint[]> {
  const client = await connect(url, { owner: 'typed-test' })
  const guard: Guard = await client.acquire('typed:k', { ttl: '30s', wait: 0 })
  const token: bigint = guard.token
  const owner: string = guard.owner
  guard.on('lost', (reason: LossReason) => console.error('lost', reason))
  let code: string | undefined
  try {
    await client.acquire('typed:k', { ttl: 1000, wait: 0, owner: 'someone-else' })
  } catch (err) {
    if (err instanceof NotAcquiredError) code = err.code
  }
  if (code !== 'not_acquired') throw new Error(`expected not_acquired, got ${code}`)
  const fence = await openFence(url)
  await fence.admit('typed:resource', token)
  const had: bigint | null = await fence.reset('typed:resource')
  if (had !== token) throw new Error(`reset answered ${had}, not ${token}`)
  const info = await client.inspect('typed:k')
  if (info === null || info.owner !== owner) throw new Error('inspect did not show the holder')
  await guard.release()
  const value: number = await client.run('typed:run', { ttl: '5s' }, async (signal: AbortSignal, g: Guard) => {
    if (signal.aborted) throw new FencelockError('aborted', 'not_held')
    return Number(g.token)
  })
  const term: bigint = await client.election('typed:e', { ttl: '5s' }).run(async (signal: AbortSignal, l: Leadership) => {
    await l.proclaim({ at: 'typed' })
    return signal.aborted ? 0n : l.term
  })
  const held = await client.acquire('typed:resume', { ttl: '5s' })
  const changes: AsyncIterable<KeyChange> = await client.watch('typed:resume')
  await held.detach()
  const resumed: Guard = await client.resume('typed:resume', held.owner, held.token, { ttl: '5s' })
  await resumed.release()
  for await (const change of changes) {
    if (change.kind === 'released' && change.token === held.token) break
  }
  await client.close()
  let closed: ErrorCode | undefined
  try {
    await client.acquire('typed:after-close')
  } catch (err) {
    if (err instanceof ClientClosedError && err instanceof UnavailableError) closed = err.code
  }
  if (closed !== 'unavailable') throw new Error(`expected a ClientClosedError, got ${closed}`)
  return [token, BigInt(value), term]
}
