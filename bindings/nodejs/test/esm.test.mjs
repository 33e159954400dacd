// The ES module entry point exports the same API as the CommonJS one.
import { it } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import * as esm from 'fencelock'

const cjs = createRequire(import.meta.url)('fencelock')

it('import and require give the same API', () => {
  for (const name of Object.keys(cjs)) assert.equal(esm[name], cjs[name], name)
  assert.equal(typeof esm.connect, 'function')
})
