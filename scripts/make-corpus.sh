#!/bin/sh
# Writes the main job's training text to $1: English prose, verse, quotations and riddles
# from Debian's fortune cookie databases (packages fortunes and fortunes-min, installed by
# scripts/install-deps.sh; about 2 MB), so a fresh machine trains on real text without a
# download. A few collections of jokes about groups of people are left out.
set -eu
out=$1
dir=/usr/share/games/fortunes
files="fortunes literature riddles wisdom science computers songs-poems people definitions work art
education humorists platitudes tao goedel law magic linux startrek kids food sports pets
paradoxum medicine love zippy miscellaneous cookie news disclaimer"
: > "$out.tmp"
for f in $files; do
  if [ ! -f "$dir/$f" ]; then
    echo "make-corpus: $dir/$f is missing (install the fortunes package: scripts/install-deps.sh)" >&2
    rm -f "$out.tmp"
    exit 1
  fi
  cat "$dir/$f" >> "$out.tmp"
done
mv "$out.tmp" "$out"
