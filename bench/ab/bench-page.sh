#!/usr/bin/env bash
# Alternating A/B of two builds of the package on parts of the browser bench page (bench/browser/):
# each package served by its own gateway on one fsync-on cluster, A then B, ROUNDS times, each
# round a run of `node bench/browser/run.mjs` with KIZUNA_BENCH_ONLY=PARTS. Prints each round's
# numeric figures of those parts, one line per round and package.
#
#   bash bench/ab/bench-page.sh PKG_DIR_A PKG_DIR_B [ROUNDS] [PARTS]
#
# PARTS: local_write (the default), batch, push, open_pending, ... (comma-separated, as run.mjs
# names them). A package directory is what `scripts/package.sh --release` leaves in pkg/ (copy it
# aside before building the other). Needs `make bench` or `make test` to have set up the tools once.
set -euo pipefail
cd "$(dirname "$0")/../.."
AB_MORE_ARGS="[PARTS]" AB_GATEWAY_FLAGS="--cross-origin-isolated" source bench/ab/gateways.sh
rounds=${3:-5}; parts=${4:-local_write}
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    url=$url_a; [ "$side" = B ] && url=$url_b
    KIZUNA_BENCH_URL="$url" KIZUNA_BENCH_ONLY="$parts" node bench/browser/run.mjs >/dev/null
    node -e '
      const r = JSON.parse(require("fs").readFileSync("target/bench/results.json", "utf8"));
      const parts = process.argv[1].split(",");
      const figures = Object.fromEntries(parts.filter((p) => r[p]).map((p) => [p, Object.fromEntries(
        Object.entries(r[p]).filter(([, v]) => typeof v === "number").map(([k, v]) => [k, +v.toFixed(3)]))]));
      console.log(`round ${process.argv[2]} ${process.argv[3]}: ${JSON.stringify(figures)}`);' "$parts" "$round" "$side"
  done
done
