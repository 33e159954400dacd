'use strict'
// Starts throwaway servers with the test kit's launcher
// (target/debug/fencelock-testkit-server, built by
// `cargo build -p fencelock-testkit --bin fencelock-testkit-server`) and
// finds the Rust CLI (target/debug/fencelock). A missing binary fails the
// test that needs it.

const { spawn, execFile } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const readline = require('node:readline')

const TARGET = process.env.CARGO_TARGET_DIR || path.join(__dirname, '..', '..', '..', 'target')
const LAUNCHER = path.join(TARGET, 'debug', 'fencelock-testkit-server')
const CLI = path.join(TARGET, 'debug', 'fencelock')

function need(binary, build) {
  if (!fs.existsSync(binary)) throw new Error(`${binary} is missing: build it with \`${build}\``)
  return binary
}

/** A server of `engine` ('sqlite' is a temporary file, no process). */
async function startServer(engine) {
  if (engine === 'sqlite') {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelock-node-'))
    return {
      url: `sqlite://${path.join(dir, 'locks.db')}`,
      command: async () => { throw new Error('sqlite has no server to control') },
      stop: async () => fs.rmSync(dir, { recursive: true, force: true }),
    }
  }
  need(LAUNCHER, 'cargo build -p fencelock-testkit --bin fencelock-testkit-server')
  const child = spawn(LAUNCHER, [engine], { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]()
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)))
  const first = await Promise.race([lines.next(), exited.then((code) => ({ exitCode: code }))])
  if (!first || first.done || first.exitCode !== undefined) {
    throw new Error(`fencelock-testkit-server ${engine} did not start (exit ${first && first.exitCode})`)
  }
  const { url } = JSON.parse(first.value)
  return {
    url,
    /** Sends a launcher command (pause, resume, kill, start); resolves on `ok`. */
    async command(cmd) {
      child.stdin.write(`${cmd}\n`)
      const answer = await lines.next()
      if (answer.done || answer.value !== 'ok') throw new Error(`${cmd}: ${answer.value}`)
    },
    /** Closing stdin stops the server and deletes its directory. */
    async stop() {
      child.stdin.end()
      await exited
    },
  }
}

/** Runs the Rust CLI; resolves with { code, stdout, stderr }. */
function cli(url, ...args) {
  need(CLI, 'cargo build -p fencelock-cli --all-features')
  return new Promise((resolve) => {
    execFile(CLI, ['--url', url, ...args], (error, stdout, stderr) => {
      resolve({ code: error ? error.code : 0, stdout, stderr })
    })
  })
}

const ADMIN_TOKEN = 'admin-token-0123456789abcdef'
const CLIENT_TOKEN = 'client-token-0123456789abcdef'

/**
 * `fencelock serve` (the CLI above) over `url` with an admin and a client
 * token (ADMIN_TOKEN, CLIENT_TOKEN). `fenceUrl(token)` is its http:// URL
 * with a token; `request(method, path, token, body)` resolves with
 * { status, body } (the JSON answer).
 */
async function startService(url) {
  need(CLI, 'cargo build -p fencelock-cli --all-features')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelock-serve-'))
  const tokens = path.join(dir, 'tokens.txt')
  fs.writeFileSync(tokens, `admin ${ADMIN_TOKEN}\nclient ${CLIENT_TOKEN} nodetest\n`, { mode: 0o600 })
  const env = { ...process.env }
  delete env.FENCELOCK_HTTP_TOKEN
  env.RUST_LOG = 'error' // not the warning every admin reset logs
  const args = ['--url', url, 'serve', '--listen', '127.0.0.1:0', '--token-file', tokens]
  const child = spawn(CLI, args, { stdio: ['ignore', 'pipe', 'inherit'], env })
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)))
  // It prints `listening on http://ADDR` once it listens; an early exit
  // ends its stdout instead.
  let base
  for await (const line of readline.createInterface({ input: child.stdout })) {
    if (line.startsWith('listening on ')) {
      base = line.slice('listening on '.length).trim()
      break
    }
  }
  if (base === undefined) throw new Error(`fencelock serve did not start (exit ${await exited})`)
  child.stdout.resume()
  return {
    base,
    fenceUrl: (token) => base.replace('http://', `http://:${token}@`),
    async request(method, route, token, body) {
      const headers = { authorization: `Bearer ${token}` }
      if (body !== undefined) headers['content-type'] = 'application/json'
      const answer = await fetch(base + route, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      })
      return { status: answer.status, body: await answer.json() }
    },
    async stop() {
      child.kill('SIGTERM')
      await exited
      fs.rmSync(dir, { recursive: true, force: true })
    },
  }
}

module.exports = { startServer, startService, cli, TARGET, ADMIN_TOKEN, CLIENT_TOKEN }
