// Types of the public API (index.js). The option and record types are the
// ones napi-rs generates from the Rust source into native.d.ts.
import { EventEmitter } from 'node:events'
import type {
  ConnectOptions,
  ElectionOptions,
  KeyChange,
  Leader,
  LockInfo,
  LeaderChange,
  LockOptions,
  ResumeOptions,
  Stats,
} from './native'

export type {
  ConnectOptions,
  ElectionOptions,
  KeyChange,
  Leader,
  LeaderChange,
  LockInfo,
  LockOptions,
  ResumeOptions,
  Stats,
}

/** Milliseconds, or a duration string such as `'30s'` or `'1m 30s'`. */
export type Duration = number | string

/** Why a lock was lost. */
export type LossReason = 'refused' | 'deadline' | 'closed'

/** The stable codes of errors: the CLI's `--json` and the REST API's words. */
export type ErrorCode =
  | 'not_acquired'
  | 'not_held'
  | 'stale'
  | 'tokens_exhausted'
  | 'invalid_key'
  | 'invalid_owner'
  | 'invalid_ttl'
  | 'invalid_token'
  | 'bad_request'
  | 'unsupported'
  | 'timeout'
  | 'unavailable'
  | 'internal'

export class FencelockError extends Error {
  constructor(message: string, code: ErrorCode)
  readonly code: ErrorCode
}
/** The wait ended while another holder had the key (`wait: 0`: the try failed). */
export class NotAcquiredError extends FencelockError {}
/** The lease is gone or cannot be trusted (`not_held`). */
export class LockLostError extends FencelockError {}
/** An empty key, a zero TTL, a bad URL, a bad option. */
export class InvalidInputError extends FencelockError {}
/** The backend cannot be reached now, or the client was closed. */
export class UnavailableError extends FencelockError {}
/** A backend call got no answer in time. */
export class OperationTimeoutError extends FencelockError {}
/** The backend cannot do this. */
export class UnsupportedError extends FencelockError {}
/** A fence refused a token lower than one it has admitted. */
export class StaleTokenError extends FencelockError {}

interface LossEvents {
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
}

/** A held lock, renewed in the background until released or lost. */
export class Guard extends EventEmitter implements LossEvents {
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
  readonly key: string
  readonly owner: string
  /** The fencing token: present it with every write to the protected resource. */
  readonly token: bigint
  readonly mode: 'exclusive' | 'shared'
  /** The semaphore slot, for a permit; null otherwise. */
  readonly slot: number | null
  readonly expiresAt: Date
  readonly remainingMs: number
  readonly isValid: boolean
  readonly lossReason: LossReason | null
  /** Settles with the reason when the lock is lost; never once released. */
  readonly lost: Promise<LossReason>
  /** Throws LockLostError once the lease cannot be trusted. */
  check(): void
  renew(): Promise<void>
  /** Stops renewal and releases the lease; a second call does nothing. */
  release(): Promise<void>
  /** Stops renewing and leaves the lease to expire, or to `client.resume(key, owner, token)`. */
  detach(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}

/** Being an election's leader: a guard on the election's key. */
export class Leadership extends Guard {
  /** The term (the token): present it to fences so that a deposed leader's writes are refused. */
  readonly term: bigint
  /** Publishes `value` as the leader's value; rejects with LockLostError once no longer leader. */
  proclaim(value: unknown): Promise<void>
  /** Steps down now, so that a standby is elected at once. */
  resign(): Promise<void>
}

/** Locks on several keys, taken all or none. */
export class MultiGuard extends EventEmitter implements LossEvents {
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
  readonly tokens: Record<string, bigint>
  readonly isValid: boolean
  readonly lost: Promise<LossReason>
  check(): void
  release(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}

export class Election {
  /** Waits to become the leader. */
  campaign(): Promise<Leadership>
  leader(): Promise<Leader | null>
  /** The current leader (first) and every change from now on; `break` stops observing. */
  observe(): Promise<AsyncIterable<LeaderChange>>
  /**
   * Campaigns, runs `fn` while leader (the signal aborts when leadership is
   * lost, and it campaigns again), resigns when `fn` settles and returns its value.
   */
  run<T>(fn: (signal: AbortSignal, leadership: Leadership) => Promise<T> | T): Promise<T>
}

export class Fence {
  /** Admits the token of an exclusive holder; rejects a stale one with StaleTokenError. */
  admit(resource: string, token: bigint): Promise<void>
  /** Admits the token of a reader of a read-write lock. */
  admitShared(resource: string, token: bigint): Promise<void>
}

export interface AcquireOptions extends Omit<LockOptions, 'ttl' | 'wait'> {
  ttl?: Duration
  /** 0 (the default): one try; Infinity: forever. */
  wait?: Duration
}

export class Client {
  readonly owner: string
  acquire(key: string, options?: AcquireOptions): Promise<Guard>
  lock(key: string, options?: AcquireOptions): Promise<Guard>
  readLock(key: string, options?: AcquireOptions): Promise<Guard>
  writeLock(key: string, options?: AcquireOptions): Promise<Guard>
  semaphore(name: string, permits: number, options?: AcquireOptions): Promise<Guard>
  lockAll(keys: string[], options?: AcquireOptions): Promise<MultiGuard>
  /** Runs fn under the lock; the signal aborts when the lock is lost. */
  run<T>(
    key: string,
    options: AcquireOptions | undefined,
    fn: (signal: AbortSignal, guard: Guard) => Promise<T> | T,
  ): Promise<T>
  /** Re-attaches to a lease a guard detached (here or in another process), once the backend confirms it. */
  resume(key: string, owner: string, token: bigint, options?: ResumeOptions): Promise<Guard>
  /** The holder changes of `key` from now on; `break` stops watching. */
  watch(key: string): Promise<AsyncIterable<KeyChange>>
  election(name: string, options?: ElectionOptions): Election
  inspect(key: string): Promise<LockInfo | null>
  list(prefix?: string): Promise<LockInfo[]>
  stats(): Promise<Stats>
  forceRelease(key: string): Promise<LockInfo | null>
  cleanup(): Promise<number>
  /** Releases every lock this client holds and stops its renewer. */
  close(): Promise<void>
}

/** Connects to the backend a URL names (sqlite, postgres, mysql, redis, redlock, etcd, zk, sharded, http). */
export function connect(url: string, options?: ConnectOptions): Promise<Client>
/** Opens the fence kept by the backend a URL names. */
export function openFence(url: string): Promise<Fence>
