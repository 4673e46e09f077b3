#!/usr/bin/env bash
# System packages that parts of the test suite use, from Debian: Chromium and its driver for the
# leaderboard's browser tests, PostgreSQL for the queue suite's second database. Idempotent: installs
# only what is missing. Without them those tests skip on a developer's machine; CI sets
# HARNESS_TEST_REQUIRE so that a skip there is a failure instead.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium chromium-driver)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
