#!/bin/sh
# Debian's Chromium for the console's browser tests (tests/e2e/test_console.py), if it is
# missing: apt-get, which needs root and the Debian registry. Without them it says why and
# exits 3; the browser tests are then skipped with that reason.
set -u
if [ -x /usr/bin/chromium ]; then
    echo "chromium: $(/usr/bin/chromium --version 2>/dev/null)"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "cannot install Debian's chromium here: apt-get as root is needed"
    exit 3
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends chromium \
    || { apt-get update && apt-get install -y --no-install-recommends chromium; } \
    || { echo "apt-get could not install chromium"; exit 3; }
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null)"
