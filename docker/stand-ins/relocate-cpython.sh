#!/usr/bin/env bash
# Lays out a CPython that this machine already has (pyenv's build: --enable-shared, made under
# $HOME/.pyenv/versions/X.Y.Z with that folder as its RUNPATH) as docker-library/python's python:X.Y-slim
# has it under /usr/local (3.12/slim-trixie/Dockerfile: `make install` to /usr/local, then test folders,
# *.pyc and libpython*.a deleted, `python`/`pip`/`pydoc`/`idle`/`python-config` links to their `*3`
# names, the interpreter linked with -rpath='$ORIGIN/../lib'). build.sh uses it for a cpython-X.Y
# stand-in whose source cannot be had here (no CPython 3.12 tarball is reachable: Debian's archive has
# none, PyPI has no CPython sdist). Used by build.sh; see README.md.
#   relocate-cpython.sh <host build> <X.Y> <output folder> <patchelf>
set -euo pipefail
src="$1" minor="$2" dest="$3" patchelf="$4"
mkdir -p "$dest"

# What `make install` put there, without the host's own packages (its site-packages holds pyenv's pip
# and the host's .pth files: the image's pip comes from build.sh's wheel instead).
tar -C "$src" --exclude="./lib/python$minor/site-packages" -cf - . | tar -C "$dest" -xf -
mkdir -p "$dest/lib/python$minor/site-packages"
cp "$src/lib/python$minor/site-packages/README.txt" "$dest/lib/python$minor/site-packages/" 2>/dev/null || true
rm -f "$dest"/bin/pip* "$dest/bin/python$minor-gdb.py"  # pyenv's pip scripts; the gdb helper is pyenv's
# docker-library deletes these after `make install` (3.12/slim-trixie/Dockerfile); bytecode folders too.
find "$dest" -depth \( \( -type d -a \( -name test -o -name tests -o -name idle_test \) \) \
  -o \( -type f -a \( -name '*.pyc' -o -name '*.pyo' -o -name 'libpython*.a' \) \) \) -exec rm -rf '{}' +
find "$dest" -depth -type d -name __pycache__ -empty -delete
# Modules whose libraries a slim image lacks: the real image builds _tkinter but keeps no libtk (its
# Dockerfile leaves *tkinter* out of the libraries it keeps), and builds no nis (no libnsl-dev).
rm -f "$dest/lib/python$minor/lib-dynload"/_tkinter.* "$dest/lib/python$minor/lib-dynload"/nis.*

# The links docker-library makes, each to its `*3` name (pyenv's point at the X.Y names).
for name in idle3 pydoc3 python3 python3-config; do
  ln -sfT "$name" "$dest/bin/$(echo "$name" | tr -d 3)"
done

# Library paths: the interpreter finds libpython as docker-library links it ($ORIGIN/../lib); the
# extension modules and libpython itself carry none (the image's ldconfig covers /usr/local/lib).
"$patchelf" --set-rpath '$ORIGIN/../lib' "$dest/bin/python$minor"
find "$dest/lib" -type f -name '*.so*' -print0 | while IFS= read -r -d '' so; do
  if [ -n "$("$patchelf" --print-rpath "$so" 2>/dev/null)" ]; then "$patchelf" --remove-rpath "$so"; fi
done

# The build's own prefix in text files (sysconfig's _sysconfigdata, the config Makefile, pkgconfig,
# python-config and the scripts' shebangs) becomes /usr/local, so sysconfig and python3-config report
# where the files now are. libpython keeps it only as getpath's last resort, after /usr/local is found.
grep -rlIZ --fixed-strings "$src" "$dest" | xargs -0 -r sed -i "s|$src|/usr/local|g"
