#!/usr/bin/env bash
# What the suite needs from the system beside .venv, checked by `make test` before the passes
# (and by .ci/run): Node and npm (the conformance suite and the stdio server come from the npm
# registry), HAProxy (tests/replicas put two gateways behind it) and Chromium with its driver
# (tests/console's browser tests). Without them the replica tests fail and the browser tests
# skip, so a missing one is installed from Debian's packages when this runs as root with
# apt-get; otherwise this names the packages and stops before any test runs.
set -euo pipefail
missing=()
need() {  # need COMMAND PACKAGE
    if ! command -v "$1" >/dev/null 2>&1 && [[ " ${missing[*]-} " != *" $2 "* ]]; then
        missing+=("$2")
    fi
}
need node nodejs
need npm npm
need haproxy haproxy
need chromium chromium
need chromedriver chromium-driver
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tests/prereqs.sh: installing ${missing[*]} from Debian's packages (the suite needs them)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    exit 0
fi
echo "tests/prereqs.sh: the test suite needs what is not installed here: ${missing[*]}" >&2
echo "  on Debian or Ubuntu: sudo apt-get install -y ${missing[*]}" >&2
exit 1
