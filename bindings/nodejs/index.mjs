// The ES module entry point: the CommonJS module's exports, by name.
import cjs from './index.js'

export const {
  connect,
  openFence,
  Client,
  Guard,
  Leadership,
  MultiGuard,
  Election,
  Fence,
  FencelockError,
  NotAcquiredError,
  LockLostError,
  InvalidInputError,
  UnavailableError,
  ClientClosedError,
  OperationTimeoutError,
  UnsupportedError,
  StaleTokenError,
  TokensExhaustedError,
  UnauthorizedError,
  InternalError,
} = cjs
export default cjs
