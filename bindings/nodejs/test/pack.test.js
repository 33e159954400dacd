'use strict'
// `npm pack` gives a package that installs into an empty project and runs
// this package's README example as pasted.

const { it } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const PACKAGE = path.join(__dirname, '..')

it('npm pack installs into an empty project and runs the README example', { timeout: 600_000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fencelock-pack-'))
  try {
    const npm = (args, cwd) => execFileSync('npm', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] })
    const packed = JSON.parse(npm(['pack', '--json', '--pack-destination', dir], PACKAGE))
    const tarball = path.join(dir, packed[0].filename)
    assert.ok(packed[0].files.some((f) => f.path.endsWith('.linux-x64-gnu.node')), 'no prebuilt addon in the package')
    const project = path.join(dir, 'project')
    fs.mkdirSync(project)
    npm(['init', '-y'], project)
    npm(['install', '--no-audit', '--no-fund', tarball], project)
    const readme = fs.readFileSync(path.join(PACKAGE, 'README.md'), 'utf8')
    const example = /```js\n([\s\S]*?)```/.exec(readme)[1]
    fs.writeFileSync(path.join(project, 'example.js'), example)
    const out = execFileSync(process.execPath, ['example.js'], { cwd: project, encoding: 'utf8' })
    assert.match(out, /holding order:123 as \S+ with token 1\n/)
    assert.match(out, /not_acquired/)
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
})
