#!/usr/bin/env bash
# Install the system packages a make target needs, when missing (Debian/Ubuntu,
# as root):
#   scripts/deps.sh demo    make demo and make serve-demo: PostgreSQL 15 (initdb,
#                           psql) and python3 with venv (.venv)
#   scripts/deps.sh spark   make spark-demo: the same and Java 17 for Spark
#   scripts/deps.sh test    make test (the default): all of the above and PGXS
#                           (postgresql-server-dev-15; make assembles the extension
#                           script with python3), pgTAP and pg_prove, curl for the
#                           README's HTTP examples, php-cli with its curl extension
#                           for the classic protocol's PHP example, Chromium for the
#                           dashboard's browser test (Playwright drives it),
#                           PgBouncer for the pooling tests and PL/Proxy for the
#                           sharding tests, gdb to replay a locking race step by step
set -euo pipefail

what=${1:-test}
case "$what" in
  demo | serve | spark | test) ;;
  *) echo "usage: scripts/deps.sh demo|serve|spark|test" >&2; exit 2 ;;
esac

sharedir=$(pg_config --sharedir 2>/dev/null || echo /usr/share/postgresql/15)
missing=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
command -v python3 >/dev/null || missing+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ "$what" = spark ] || [ "$what" = test ]; then
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
fi
if [ "$what" = test ]; then
  [ -f "$(pg_config --pgxs 2>/dev/null || echo /nonexistent)" ] || missing+=(postgresql-server-dev-15)
  [ -f "$sharedir/extension/pgtap.control" ] || missing+=(postgresql-15-pgtap)
  command -v pg_prove >/dev/null || missing+=(libtap-parser-sourcehandler-pgtap-perl)
  command -v curl >/dev/null || missing+=(curl)
  command -v php >/dev/null || missing+=(php-cli)
  php -m 2>/dev/null | grep -x curl >/dev/null || missing+=(php-curl)  # not -q: an early exit would fail the pipe
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
  [ -f "$sharedir/extension/plproxy.control" ] || missing+=(postgresql-15-plproxy)
  command -v gdb >/dev/null || missing+=(gdb)
fi

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "deps ($what): installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
