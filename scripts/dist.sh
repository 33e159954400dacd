#!/usr/bin/env bash
# Builds the release artifacts into dist/ from a checkout, for users who have
# no Rust toolchain:
#
#   fencelock-VERSION-x86_64-unknown-linux-gnu.tar.gz   the CLI, stripped
#   fencelock-VERSION.tgz                               the npm package `fencelock`
#   fencelock-linux-x64-gnu-VERSION.tgz                 its release addon (napi-rs's
#                                                       per-platform package)
#   fencelock-VERSION-cp39-abi3-manylinux2014_x86_64…whl   the Python wheel (abi3)
#
# The Go module (clients/go) needs no build.
#
# All three native builds link against glibc 2.17 (cargo-zigbuild's and
# maturin's `--zig`: zig supplies the old glibc's symbol versions), so the
# artifacts run on every glibc distribution from CentOS 7 on, not only on
# the one that built them; this script checks the symbol versions. They
# are built in the `dist` profile (the root Cargo.toml: optimised for size,
# whole-program LTO, stripped) in one cached target (DIST_TARGET_DIR), so a
# second run rebuilds only what changed; the CLI and the addon share the
# dependencies they resolve alike.
#
# Tools: cargo-zigbuild, zig (the `ziglang` package from PyPI), maturin and
# auditwheel, installed at pinned versions into DIST_TOOLS on first use;
# npm and python3 from the machine.
#
#   scripts/dist.sh            build everything into dist/
#   scripts/dist-check.sh      install each artifact into an empty project on
#                              a PATH without cargo or rustc, and take a lock
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

triple=x86_64-unknown-linux-gnu
glibc=2.17
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
tools="${DIST_TOOLS:-$cache/fencelock-dist/tools}"
export CARGO_TARGET_DIR="${DIST_TARGET_DIR:-$cache/fencelock-dist/target}"
out="${DIST_DIR:-$repo/dist}"
built="$CARGO_TARGET_DIR/$triple/dist"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
# One version for the three packages: a mismatch would publish a wheel and
# an npm package that claim different releases of the same code.
node_version=$(node -p "require('./bindings/nodejs/package.json').version")
python_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' bindings/python/pyproject.toml | head -n1)
if [ "$node_version" != "$version" ] || [ "$python_version" != "$version" ]; then
  echo "dist.sh: versions differ: Cargo.toml $version, package.json $node_version, pyproject.toml $python_version" >&2
  exit 1
fi

step() { echo "==> $*"; }
started=$SECONDS

# --- tools --------------------------------------------------------------
# Pinned: a new zig or maturin can change what the artifacts link against.
mkdir -p "$tools"
if [ ! -x "$tools/venv/bin/maturin" ]; then
  step "tools: ziglang, maturin, auditwheel into $tools/venv"
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q ziglang==0.17.1 maturin==1.16.0 auditwheel==6.8.2
fi
if [ ! -x "$tools/bin/cargo-zigbuild" ]; then
  step "tools: cargo-zigbuild into $tools/bin"
  cargo install -q --locked --root "$tools" cargo-zigbuild@0.24.1
fi
# cargo-zigbuild and maturin find zig as `python -m ziglang` on this PATH.
export PATH="$tools/venv/bin:$tools/bin:$PATH"

rm -rf "$out"
mkdir -p "$out"

# newest_glibc FILE: the newest GLIBC_x.y symbol version FILE needs.
newest_glibc() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1
}
check_glibc() {
  local needs
  needs=$(newest_glibc "$1")
  if [ "$(printf '%s\n%s\n' "$needs" "$glibc" | sort -V | tail -n1)" != "$glibc" ]; then
    echo "dist.sh: $1 needs glibc $needs, above $glibc" >&2
    return 1
  fi
  echo "    $(basename "$1"): needs glibc $needs at most"
}

# --- the CLI ----------------------------------------------------------------
step "CLI (cargo zigbuild, glibc $glibc)"
cargo zigbuild --profile dist --locked --target "$triple.$glibc" -p fencelock-cli --features tls
check_glibc "$built/fencelock"
name="fencelock-$version-$triple"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/$name"
cp "$built/fencelock" README.md LICENSE-MIT LICENSE-APACHE "$stage/$name/"
tar -C "$stage" -czf "$out/$name.tar.gz" --owner=0 --group=0 "$name"

# --- the Node.js package ----------------------------------------------------
# napi-rs's way to ship a native addon: the package `fencelock` (JavaScript,
# types) lists one package per platform as an optional dependency; npm
# installs the one whose os/cpu/libc match. native.js loads
# `fencelock-linux-x64-gnu` when no addon sits beside it.
step "Node.js addon (cargo zigbuild, glibc $glibc)"
cargo zigbuild --profile dist --locked --target "$triple.$glibc" --manifest-path bindings/nodejs/Cargo.toml
check_glibc "$built/libfencelock_node.so"
platform="$stage/npm-platform"
mkdir -p "$platform"
cp "$built/libfencelock_node.so" "$platform/fencelock.linux-x64-gnu.node"
cp LICENSE-MIT LICENSE-APACHE "$platform/"
VERSION="$version" node -e '
  const fs = require("fs")
  const main = require("./bindings/nodejs/package.json")
  const pkg = {
    name: "fencelock-linux-x64-gnu",
    version: process.env.VERSION,
    description: "The x86_64 Linux (glibc) native addon of the fencelock package",
    license: main.license,
    os: ["linux"],
    cpu: ["x64"],
    libc: ["glibc"],
    main: "fencelock.linux-x64-gnu.node",
    files: ["fencelock.linux-x64-gnu.node", "LICENSE-MIT", "LICENSE-APACHE"],
    engines: main.engines,
  }
  fs.writeFileSync(process.argv[1] + "/package.json", JSON.stringify(pkg, null, 2) + "\n")
' "$platform"
(cd "$platform" && npm pack --silent --pack-destination "$out" >/dev/null)

# The main package: the files package.json lists, but no addon (a debug one
# may lie in the source directory), and the platform package as an optional
# dependency at exactly this version. Development-only fields are dropped.
main_pkg="$stage/npm-main"
mkdir -p "$main_pkg"
(cd bindings/nodejs && cp index.js index.mjs index.d.ts native.js native.d.ts README.md "$main_pkg/")
cp LICENSE-MIT LICENSE-APACHE "$main_pkg/"
VERSION="$version" node -e '
  const fs = require("fs")
  const pkg = require("./bindings/nodejs/package.json")
  delete pkg.devDependencies
  delete pkg.scripts
  delete pkg.napi
  pkg.files = pkg.files.filter((f) => f !== "*.node").concat(["LICENSE-MIT", "LICENSE-APACHE"])
  pkg.optionalDependencies = { "fencelock-linux-x64-gnu": process.env.VERSION }
  fs.writeFileSync(process.argv[1] + "/package.json", JSON.stringify(pkg, null, 2) + "\n")
' "$main_pkg"
(cd "$main_pkg" && npm pack --silent --pack-destination "$out" >/dev/null)

# --- the Python wheel ---------------------------------------------------------
step "Python wheel (maturin --zig, manylinux2014 = glibc $glibc)"
# A target directory of its own, inside the shared one: maturin's zig
# wrapper is another linker path than cargo-zigbuild's, and cargo counts the
# linker in every unit's fingerprint, so in one directory each build would
# recompile everything the other built last.
CARGO_TARGET_DIR="$CARGO_TARGET_DIR/maturin" \
  maturin build --profile dist --locked --zig --target "$triple" --compatibility manylinux2014 \
  --manifest-path bindings/python/Cargo.toml --out "$out" --quiet
wheel=$(ls "$out"/fencelock-"$version"-*.whl)
# auditwheel is the PyPA's own judge of the manylinux policy: it must find
# the wheel consistent with manylinux_2_17 and needing no external library.
auditwheel show "$wheel" | tee "$stage/auditwheel.txt"
grep -q 'manylinux_2_17_x86_64' "$stage/auditwheel.txt"

step "dist/ ($((SECONDS - started)) s)"
(cd "$out" && ls -l)
