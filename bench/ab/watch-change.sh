#!/usr/bin/env bash
# Alternating A/B of two builds of the package: how long a live query takes to hear a change. Each
# round and package, in a fresh browser context: 20,000 rows written locally, a watch of the 10,000
# whose `done` is false, then fifteen patches of rows in it, each timed from the patch's call until
# the listener is called; prints the median per round and package, then the medians of the rounds.
#
#   bash bench/ab/watch-change.sh PKG_DIR_A PKG_DIR_B [ROUNDS]
#
# A package directory is what `scripts/package.sh --release` leaves in pkg/ (copy it aside before
# building the other). Needs `make bench` or `make test` to have set up the tools once.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/ab/gateways.sh
KIZUNA_AB_URLS="$url_a,$url_b" KIZUNA_AB_ROUNDS="${3:-4}" node bench/ab/watch-change.mjs
