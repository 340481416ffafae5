#!/usr/bin/env bash
# Copy an SDK of this checkout into a package folder, where the package imports it from. A
# package runs as installed, with nothing outside its folder, so it carries its SDK; the
# repository keeps one copy of each SDK (extensions/), and staging, the tests and
# `make stage` copy it from there with this script.
#
# Usage: scripts/vendor-sdk.sh python|node PACKAGE_DIR
#   python  every *.py of extensions/python/conduit_extension/, and py.typed,
#           into PACKAGE_DIR/conduit_extension/
#   node    package.json, the *.js and *.d.ts files at the top of extensions/node/, and lib/*.js
#           (the files package.json's `files` names; the SDK's tests keep the two equal),
#           into PACKAGE_DIR/node_modules/conduit-extension/
#
# An earlier copy at that place is replaced whole, so a module the SDK no longer has does not
# linger. Nothing is built and nothing outside PACKAGE_DIR is written. Exit 2 on a usage error.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 python|node PACKAGE_DIR   (e.g. $0 python /tmp/packages/greeter)" >&2
    exit 2
fi
lang=$1
pkg=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case $lang in
    python)
        src=$root/extensions/python/conduit_extension
        dest=$pkg/conduit_extension
        rm -rf "$dest"
        mkdir -p "$dest"
        cp "$src"/*.py "$src/py.typed" "$dest/"
        ;;
    node)
        src=$root/extensions/node
        dest=$pkg/node_modules/conduit-extension
        rm -rf "$dest"
        mkdir -p "$dest/lib"
        cp "$src/package.json" "$src"/*.js "$src"/*.d.ts "$dest/"
        cp "$src"/lib/*.js "$dest/lib/"
        ;;
    *)
        echo "$0: no SDK for \`$lang\`: name python or node" >&2
        exit 2
        ;;
esac
