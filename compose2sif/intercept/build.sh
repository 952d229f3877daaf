#!/bin/sh
# Builds c2s-loopback (loopback*.c, loopback.h lists them) as one static binary (it runs inside
# any image: glibc, musl or none).
#   build.sh OUTPUT      (CC picks the compiler; default cc)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUTPUT}
${CC:-cc} -static -O2 -Wall -Wextra -Werror -o "$out.tmp.$$" "$here"/loopback*.c
mv "$out.tmp.$$" "$out"
