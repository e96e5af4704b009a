#!/usr/bin/env bash
# Builds the npm package `kizunasync` into pkg/ (generated, not committed):
#   1. wasm-pack build --target web (the profile flag is the first argument: --dev by default,
#      --release for `make demo` and publishing);
#   2. pkg/README.md is the package's own README (npm/README.md), not the repository's;
#   3. package.json gets its real metadata (repository, homepage, bugs, keywords, types, sideEffects);
#   4. the `any` of wasm-bindgen's raw wasm exports (InitOutput in kizunasync.d.ts, and
#      kizunasync_bg.wasm.d.ts) becomes `unknown`, and the build fails if an `any` is left in a
#      shipped declaration.
# `scripts/package.sh --finish-only` runs steps 2-4 on the pkg/ already built.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PWD/tools/node_modules/.bin:$PATH"

if [ "${1:-}" != "--finish-only" ]; then
  wasm-pack build "${1:---dev}" --target web --out-dir pkg
fi
[ -f pkg/package.json ] || { echo "package.sh: pkg/ has not been built" >&2; exit 1; }

node --input-type=module - pkg npm/README.md <<'JS'
import { readFileSync, writeFileSync, copyFileSync, existsSync } from "node:fs";
import { join } from "node:path";

const [dir, readme] = process.argv.slice(2);
copyFileSync(readme, join(dir, "README.md"));

const manifestPath = join(dir, "package.json");
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const repo = "https://github.com/kizuna-sync/kizunasync";
Object.assign(manifest, {
  repository: { type: "git", url: `git+${repo}.git` },
  homepage: `${repo}#readme`,
  bugs: { url: `${repo}/issues` },
  keywords: ["offline-first", "local-first", "sync", "indexeddb", "postgres", "supabase", "wasm", "outbox"],
  types: "kizunasync.d.ts",
  // The module's only top-level effect is on its own class; wasm-bindgen's JS snippets, when a
  // build has them, must never be dropped by a bundler.
  sideEffects: existsSync(join(dir, "snippets")) ? ["./snippets/*"] : false,
});
writeFileSync(manifestPath, JSON.stringify(manifest, null, 2) + "\n");

// wasm-bindgen types the raw wasm exports with `any`. They are internal (the app calls the class),
// so `unknown` is as true and keeps the shipped declarations free of `any`.
const unknownFor = (text) => text.replace(/\bany\b/g, "unknown");
const dts = join(dir, "kizunasync.d.ts");
const text = readFileSync(dts, "utf8");
const rewritten = text.replace(/^export interface InitOutput \{[\s\S]*?^\}/m, unknownFor);
writeFileSync(dts, rewritten);
const raw = join(dir, "kizunasync_bg.wasm.d.ts");
if (existsSync(raw)) writeFileSync(raw, unknownFor(readFileSync(raw, "utf8")));

const left = [dts, raw].filter(existsSync).flatMap((file) =>
  readFileSync(file, "utf8").split("\n").flatMap((line, i) => (/\bany\b/.test(line) ? [`${file}:${i + 1}: ${line.trim()}`] : [])));
if (left.length > 0) {
  console.error("package.sh: `any` left in the shipped declarations:\n" + left.join("\n"));
  process.exit(1);
}
console.log(`package.sh: ${dir}/ is the npm package ${manifest.name}@${manifest.version}`);
JS
