// Compiled by typed.test.js in a project without @types/node and without
// the DOM library: the shipped types must stand alone. Not run.
import { connect, Client, Guard, type KeyChange, type LossReason } from 'fencelock'

export async function main(url: string): Promise<bigint> {
  const client: Client = await connect(url)
  const guard: Guard = await client.acquire('k', { ttl: '30s' })
  guard.on('lost', (reason: LossReason) => void reason)
  for await (const change of client.watch('k')) {
    const kind: KeyChange['kind'] = change.kind
    void kind
    break
  }
  const token = await client.run('k2', undefined, async (signal, g) => {
    void signal
    return g.token
  })
  await guard[Symbol.asyncDispose]()
  // @ts-expect-error: a Client comes from connect()
  void new Client()
  // @ts-expect-error: a Guard comes from an acquisition
  void new Guard()
  return token
}
