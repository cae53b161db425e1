#!/usr/bin/env bash
# Install the system packages pgdq's build and tests need, when missing:
# PGXS (postgresql-server-dev-15), pgTAP and pg_prove, python3 with venv
# (.venv; make assembles the extension script with python3), and Java 17 for
# the Spark tests and demo, curl for the README's HTTP examples, php-cli with
# its curl extension for the classic protocol's PHP example, and Chromium for
# the dashboard's browser test (Playwright drives it), PgBouncer for the
# pooling tests and PL/Proxy for the sharding tests. Debian/Ubuntu, as root.
set -euo pipefail

sharedir=$(pg_config --sharedir 2>/dev/null || echo /usr/share/postgresql/15)
missing=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
[ -f "$(pg_config --pgxs 2>/dev/null || echo /nonexistent)" ] || missing+=(postgresql-server-dev-15)
[ -f "$sharedir/extension/pgtap.control" ] || missing+=(postgresql-15-pgtap)
command -v pg_prove >/dev/null || missing+=(libtap-parser-sourcehandler-pgtap-perl)
command -v python3 >/dev/null || missing+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v curl >/dev/null || missing+=(curl)
command -v php >/dev/null || missing+=(php-cli)
php -m 2>/dev/null | grep -x curl >/dev/null || missing+=(php-curl)  # not -q: an early exit would fail the pipe
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
[ -f "$sharedir/extension/plproxy.control" ] || missing+=(postgresql-15-plproxy)

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
