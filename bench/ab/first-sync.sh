#!/usr/bin/env bash
# Alternating A/B of two builds of the package: first syncs of the bulk fixture's 100,000 rows
# (pages of 1000) in headless Chromium, each package served by its own gateway on one fsync-on
# cluster, A then B, ROUNDS times. Read the medians and how many rounds each won: on this shared
# 2-core machine one run of each moves by more than most changes.
#
#   bash bench/ab/first-sync.sh PKG_DIR_A PKG_DIR_B [ROUNDS]
#
# A package directory is what `scripts/package.sh --release` leaves in pkg/ (copy it aside before
# building the other). Needs `make bench` or `make test` to have set up the tools once.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/ab/gateways.sh
rounds=${3:-5}
psql "$db" -qf tests/fixtures/bulk.sql >/dev/null
psql "$db" -qc analyze
KIZUNA_AB_URLS="$url_a,$url_b" KIZUNA_AB_ROUNDS="$rounds" node bench/ab/first-sync.mjs
