// Types of the public API (index.js). The option and record types are the
// ones napi-rs generates from the Rust source into native.d.ts.
//
// They stand alone: no @types/node, no DOM library needed (test/typed.test.js
// compiles a project with neither). The two global names they use are
// declared below as empty or exactly as the standard libraries declare
// them, so they merge with @types/node, lib.dom or lib.esnext.disposable
// when a project has those. The classes' constructors are not public: a
// Client comes from connect(), a Guard from an acquisition.
declare global {
  // Symbol.asyncDispose (`await using`): as lib.esnext.disposable and
  // @types/node declare it.
  interface SymbolConstructor {
    readonly asyncDispose: unique symbol
  }
  // The signal run() passes: the runtime's AbortSignal (lib.dom and
  // @types/node describe it).
  interface AbortSignal {}
}

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

export {}

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
  | 'unauthorized'
  | 'internal'

export declare class FencelockError extends Error {
  constructor(message: string, code: ErrorCode)
  readonly code: ErrorCode
}
/** The wait ended while another holder had the key (`wait: 0`: the try failed). */
export declare class NotAcquiredError extends FencelockError {}
/** The lease is gone or cannot be trusted (`not_held`). */
export declare class LockLostError extends FencelockError {}
/** An empty key, a zero TTL, a bad URL, a bad option. */
export declare class InvalidInputError extends FencelockError {}
/** The backend cannot be reached now, or the client was closed. */
export declare class UnavailableError extends FencelockError {}
/** The client was closed (code `unavailable`). */
export declare class ClientClosedError extends UnavailableError {}
/** A backend call got no answer in time. */
export declare class OperationTimeoutError extends FencelockError {}
/** The backend cannot do this. */
export declare class UnsupportedError extends FencelockError {}
/** A fence refused a token lower than one it has admitted. */
export declare class StaleTokenError extends FencelockError {}
/** The key's token counter is at its maximum (code `tokens_exhausted`). */
export declare class TokensExhaustedError extends FencelockError {}
/** The backend refused the URL's credentials (code `unauthorized`). */
export declare class UnauthorizedError extends FencelockError {}
/** Any other failure: the backend's, or the package's own (code `internal`). */
export declare class InternalError extends FencelockError {}

/**
 * The event side of a guard (at run time a Node.js `EventEmitter`): its one
 * event is `'lost'`, with the reason.
 */
export interface LossEvents {
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
  off(event: 'lost', listener: (reason: LossReason) => void): this
  addListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeAllListeners(event?: 'lost'): this
  listenerCount(event: 'lost'): number
}

/**
 * A stream of changes: an async iterable (`for await (const c of
 * client.watch(k))`; `break` stops it), which can also be awaited: `await`
 * settles once the watch is in place, so that every change after it is seen.
 */
export interface Changes<T> extends AsyncIterable<T>, PromiseLike<AsyncIterable<T>> {}

/** A held lock, renewed in the background until released or lost. */
export declare class Guard implements LossEvents {
  /** Guards come from acquisitions (`client.acquire`, …). */
  protected constructor()
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
  off(event: 'lost', listener: (reason: LossReason) => void): this
  addListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeAllListeners(event?: 'lost'): this
  listenerCount(event: 'lost'): number
  readonly key: string
  readonly owner: string
  /** The fencing token: present it with every write to the protected resource. */
  readonly token: bigint
  readonly mode: 'exclusive' | 'shared'
  /** The semaphore slot, for a permit; null otherwise. */
  readonly slot: number | null
  readonly expiresAt: Date
  readonly remainingMs: number
  /** False once lost, released or detached. */
  readonly isValid: boolean
  readonly lossReason: LossReason | null
  /** Settles with the reason when the lock is lost; never once released. */
  readonly lost: Promise<LossReason>
  /** Throws LockLostError (code `not_held`) once the lease cannot be trusted, or was released. */
  check(): void
  /** Rejects with LockLostError once lost or released. */
  renew(): Promise<void>
  /** Stops renewal and releases the lease; a second call does nothing. */
  release(): Promise<void>
  /** Stops renewing and leaves the lease to expire, or to `client.resume(key, owner, token)`. */
  detach(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}

/** Being an election's leader: a guard on the election's key. */
export declare class Leadership extends Guard {
  protected constructor()
  /** The term (the token): present it to fences so that a deposed leader's writes are refused. */
  readonly term: bigint
  /** Publishes `value` as the leader's value; rejects with LockLostError once no longer leader. */
  proclaim(value: unknown): Promise<void>
  /** Steps down now, so that a standby is elected at once. */
  resign(): Promise<void>
}

/** Locks on several keys, taken all or none. */
export declare class MultiGuard implements LossEvents {
  private constructor()
  on(event: 'lost', listener: (reason: LossReason) => void): this
  once(event: 'lost', listener: (reason: LossReason) => void): this
  off(event: 'lost', listener: (reason: LossReason) => void): this
  addListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeListener(event: 'lost', listener: (reason: LossReason) => void): this
  removeAllListeners(event?: 'lost'): this
  listenerCount(event: 'lost'): number
  readonly tokens: Record<string, bigint>
  readonly isValid: boolean
  readonly lost: Promise<LossReason>
  check(): void
  release(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}

export declare class Election {
  private constructor()
  /** Waits to become the leader. */
  campaign(): Promise<Leadership>
  leader(): Promise<Leader | null>
  /** The current leader (first) and every change from now on; `break` stops observing. */
  observe(): Changes<LeaderChange>
  /**
   * Campaigns, runs `fn` while leader (the signal aborts when leadership is
   * lost, and it campaigns again), resigns when `fn` settles and returns its value.
   */
  run<T>(fn: (signal: AbortSignal, leadership: Leadership) => Promise<T> | T): Promise<T>
}

export declare class Fence {
  private constructor()
  /** Admits the token of an exclusive holder; rejects a stale one with StaleTokenError. */
  admit(resource: string, token: bigint): Promise<void>
  /** Admits the token of a reader of a read-write lock. */
  admitShared(resource: string, token: bigint): Promise<void>
  /**
   * Forgets the resource's fence: its highest tokens and the value stored
   * with them, so that a lower token is admitted again. Resolves to the
   * highest token it had admitted (in either mode), or `null` if none.
   * The operator's repair of a fence a token no grant issued has blocked,
   * never a step of a holder's protocol; one atomic step of the fence's
   * store. An `http://` fence needs the service's admin token (a client
   * token is refused with a 403, an `UnauthorizedError`).
   */
  reset(resource: string): Promise<bigint | null>
}

export interface AcquireOptions extends Omit<LockOptions, 'ttl' | 'wait'> {
  ttl?: Duration
  /** 0 (the default): one try; Infinity: forever. */
  wait?: Duration
}

export declare class Client {
  /** Clients come from `connect()`. */
  private constructor()
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
  watch(key: string): Changes<KeyChange>
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
