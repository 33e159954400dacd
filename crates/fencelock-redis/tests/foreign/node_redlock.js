// node-redlock (with ioredis) on one Redis server, driven line by line by
// tests/foreign_locks.rs. argv[2]: the Redis URL. Prints `ready VERSION`,
// then answers `acquire KEY TTL_MS` with `granted` or `held` (one try, no
// retries) and `release KEY` with `released` or `not-held`.
'use strict';
const readline = require('readline');
const Redis = require('ioredis');
const Redlock = require('redlock');

const client = new Redis(process.argv[2]);
const redlock = new Redlock([client], { retryCount: 0 });
const locks = new Map();
const say = (text) => process.stdout.write(text + '\n');

async function handle(line) {
  const [command, key, ttl] = line.trim().split(/\s+/);
  if (command === 'acquire') {
    try {
      locks.set(key, await redlock.lock(key, Number(ttl)));
      say('granted');
    } catch (e) {
      if (!(e instanceof Redlock.LockError)) throw e;
      say('held');
    }
  } else if (command === 'release') {
    const lock = locks.get(key);
    locks.delete(key);
    try {
      if (!lock) throw new Redlock.LockError('not acquired here');
      await lock.unlock();
      say('released');
    } catch (e) {
      if (!(e instanceof Redlock.LockError)) throw e;
      say('not-held');
    }
  } else {
    say(`unknown command ${command}`);
  }
}

say(`ready ${require('redlock/package.json').version}`);
// One line at a time, in order.
let queue = Promise.resolve();
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  queue = queue.then(() => handle(line));
}).on('close', () => queue.then(() => client.quit()));
