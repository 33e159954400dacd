#!/usr/bin/env bash
# Checks the artifacts scripts/dist.sh left in dist/ as a user without a Rust
# toolchain gets them: each is installed into an empty project on a PATH with
# no cargo, rustc or rustup, and takes a lock on the embedded SQLite backend.
# Prints each install's time and installed size, and fails if an artifact
# does not install, does not take its lock, or outgrows its size budget
# (npm: 40 MB installed, Python: 15 MB installed). Times are printed, never
# asserted: they depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
dist="${DIST_DIR:-$PWD/dist}"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
triple=x86_64-unknown-linux-gnu

# The PATH of a machine without Rust: every directory that holds cargo,
# rustc or rustup is dropped.
clean=
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  if [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] || [ -e "$dir/rustup" ]; then continue; fi
  clean+="${clean:+:}$dir"
done
export PATH="$clean"
unset CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN CARGO_TARGET_DIR RUSTC RUSTFLAGS
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
  echo "dist-check: a Rust toolchain is still on PATH" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { echo "${EPOCHREALTIME/./}"; }
seconds() { # MICROSECONDS-SINCE → seconds, two decimals
  local us=$(($(now) - $1))
  printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000))
}
mb() { # PATH → installed size in MB, one decimal
  local bytes
  bytes=$(du -sb "$1" | cut -f1)
  printf '%d.%d' $((bytes / 1000000)) $((bytes % 1000000 / 100000))
}
# within_budget WHAT PATH MEGABYTES
within_budget() {
  local bytes
  bytes=$(du -sb "$2" | cut -f1)
  if [ "$bytes" -gt $(($3 * 1000000)) ]; then
    echo "dist-check: $1 installs $(mb "$2") MB, above its budget of $3 MB" >&2
    return 1
  fi
}
# took_lock WHAT OUTPUT: the program printed the token of its grant.
took_lock() {
  if ! grep -qE '^token [1-9][0-9]*$' <<<"$2"; then
    echo "dist-check: $1 did not take its lock; it printed:" >&2
    echo "$2" >&2
    return 1
  fi
}

# --- the CLI tarball ------------------------------------------------------
mkdir "$work/cli"
tar -xzf "$dist/fencelock-$version-$triple.tar.gz" -C "$work/cli"
cli="$work/cli/fencelock-$version-$triple/fencelock"
t0=$(now)
# shellcheck disable=SC2016 # the command expands FENCELOCK_TOKEN, not this shell
said=$("$cli" run --url "sqlite://$work/cli/locks.db" --ttl 5s nightly -- sh -c 'echo "token $FENCELOCK_TOKEN"')
took_lock "the CLI" "$said"
echo "dist-check: CLI: fencelock run took its lock in $(seconds "$t0") s; binary $(mb "$cli") MB"
# The shipped binary has no `lab` (no throwaway servers, no fault
# injection), and says how to get its commands instead of "unrecognized
# subcommand".
for args in "torture --server sqlite" "bench --scenario cycle --json" "scorecard"; do
  # shellcheck disable=SC2086 # the words of $args are the arguments
  if said=$("$cli" --url "sqlite://$work/cli/locks.db" $args 2>&1); then
    echo "dist-check: the shipped CLI ran \`$args\`, a lab command" >&2
    exit 1
  fi
  if ! grep -q "is not in this build; build fencelock with the lab feature" <<<"$said"; then
    echo "dist-check: the shipped CLI did not say how to get \`${args%% *}\`; it said:" >&2
    echo "$said" >&2
    exit 1
  fi
done
echo "dist-check: CLI: torture, bench and scorecard are not in it, and it says how to get them"

# --- the npm packages -------------------------------------------------------
mkdir "$work/node"
cd "$work/node"
npm init -y >/dev/null
t0=$(now)
npm install --no-audit --no-fund --silent \
  "$dist/fencelock-$version.tgz" "$dist/fencelock-linux-x64-gnu-$version.tgz"
install=$(seconds "$t0")
t0=$(now)
said=$(node -e "
  const { connect } = require('fencelock')
  ;(async () => {
    const client = await connect('sqlite://$work/node/locks.db')
    const guard = await client.acquire('nightly', { ttl: '5s' })
    console.log('token ' + guard.token)
    await guard.release()
    await client.close()
  })().catch((e) => { console.error(e); process.exit(1) })
")
took_lock "the npm package" "$said"
echo "dist-check: npm: install $install s, first lock $(seconds "$t0") s; installed $(mb node_modules) MB"
within_budget "the npm package" node_modules 40

# --- the wheel --------------------------------------------------------------
mkdir "$work/python"
cd "$work/python"
python3 -m venv venv
wheel=$(ls "$dist"/fencelock-"$version"-*.whl)
t0=$(now)
# --no-index: the wheel alone, nothing from a registry.
venv/bin/pip install -q --no-index "$wheel"
install=$(seconds "$t0")
t0=$(now)
said=$(venv/bin/python -c "
import fencelock
with fencelock.connect_sync('sqlite://$work/python/locks.db').lock('nightly', ttl=5.0) as guard:
    print('token', guard.token)
")
took_lock "the wheel" "$said"
site=$(venv/bin/python -c 'import fencelock, os; print(os.path.dirname(fencelock.__file__))')
echo "dist-check: wheel: pip install $install s, first lock $(seconds "$t0") s; installed $(mb "$site") MB"
within_budget "the wheel" "$site" 15
echo "dist-check: every artifact installed without Rust and took its lock"
