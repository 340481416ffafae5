#!/bin/sh
# Build the extension and stage its installable package folder, package/: the manifest and the
# binary its `command` names, nothing else. PROFILE (default release) picks the cargo profile;
# CARGO_TARGET_DIR is honoured.
set -eu
cd "$(dirname "$0")"
profile=${PROFILE:-release}
cargo build --profile "$profile"
case $profile in dev | debug) dir=debug ;; *) dir=$profile ;; esac
target=${CARGO_TARGET_DIR:-target}
rm -rf package
mkdir package
cp conduit-extension.toml package/
cp "$target/$dir/conduit-{{name}}" package/
echo "staged package/ (check it: conduit ext check package; install it: conduit ext install package)"
