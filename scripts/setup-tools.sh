#!/usr/bin/env bash
# Installs what `make test` and `make demo` need on a fresh machine, and skips what is already there.
# Idempotent: each step checks before it installs, so a warm machine pays almost nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.cargo/bin:$PATH"
need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql)
command -v runuser >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

# wasm-bindgen-cli must match the wasm-bindgen in Cargo.lock exactly, or wasm-pack fetches its own.
bindgen_version=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$bindgen_version" ]; then
  echo "setup: cargo install wasm-bindgen-cli $bindgen_version"
  cargo install --quiet wasm-bindgen-cli --version "$bindgen_version"
fi
command -v wasm-pack >/dev/null || { echo "setup: cargo install wasm-pack"; cargo install --quiet wasm-pack; }

# The Vite app of scripts/app-test.sh installs vite 8, which needs node ^20.19 or >= 22.12.
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit((a === 20 && b >= 19) || (a === 22 && b >= 12) || a > 22 ? 0 : 1)' \
  || { echo "setup: node $(node --version) is too old for vite 8 (needs ^20.19 or >= 22.12)" >&2; exit 1; }

# A wasm-opt on PATH keeps wasm-pack from downloading binaryen; npm's build is current enough
# for the features rustc emits today, Debian's is not.
if [ ! -x tools/node_modules/.bin/wasm-opt ] || [ ! -d tools/node_modules/playwright-core ] || [ ! -x tools/node_modules/.bin/tsc ]; then
  echo "setup: npm install (binaryen, playwright-core, typescript) into tools/"
  (cd tools && npm install --silent --no-audit --no-fund)
fi
echo "setup: tools ready"
