#!/usr/bin/env bash
# Stage the example packages as installable package folders, building nothing.
#
# Usage: scripts/stage-examples.sh PROFILE OUT_DIR [EXAMPLE...]
#   PROFILE  the cargo profile the examples were built with: dev (or debug), release, dist, …
#   OUT_DIR  where to put one package folder per example: OUT_DIR/echo, OUT_DIR/notes, …
#   EXAMPLE  the examples to stage (folder names under examples/); default: every one
#
# A Rust example (a folder with Cargo.toml) becomes its conduit-extension.toml plus the binary
# its `command` names, copied from $CARGO_TARGET_DIR/PROFILE (default target/ in the
# workspace). Any other example is copied as it is, and one whose `command` runs python3 or
# node gets that SDK of this checkout beside it (scripts/vendor-sdk.sh): the repository keeps
# no copy of an SDK under examples/. An example without a manifest is not a package and is
# skipped with a message. A missing binary is an error that says how to build it: this script
# never builds. Exit 1 on such an error, 2 on a usage error.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 PROFILE OUT_DIR [EXAMPLE...]   (e.g. $0 dev /tmp/packages)" >&2
    exit 2
fi
profile=$1
out=$2
shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
# Like cargo, a relative CARGO_TARGET_DIR is relative to the current directory.
case $target in /*) ;; *) target=$PWD/$target ;; esac
# Cargo puts the dev profile in target/debug; every other profile in a folder of its name.
# `debug` is only that folder's name: cargo refuses `--profile debug`, so the hint says `dev`'s
# own command.
case $profile in
    dev | debug) bin_dir=$target/debug build="cargo build --workspace" ;;
    *) bin_dir=$target/$profile build="cargo build --workspace --profile $profile" ;;
esac

# The program is the first element of `command`, e.g. command = ["./conduit-echo"].
program_of() {
    sed -n 's/^[[:space:]]*command[[:space:]]*=[[:space:]]*\[[[:space:]]*"\([^"]*\)".*/\1/p' "$1" | head -n 1
}

if [ $# -eq 0 ]; then
    set -- "$root"/examples/*/
else
    for name in "$@"; do
        if [ ! -d "$root/examples/$name" ]; then
            echo "no example \`$name\` (examples/$name is not a folder); the examples are: $(cd "$root/examples" && ls -d */ | tr -d / | tr '\n' ' ')" >&2
            exit 2
        fi
    done
    set -- "${@/#/$root/examples/}"
fi
mkdir -p "$out"
staged=0
for src in "$@"; do
    src=${src%/}
    name=$(basename "$src")
    manifest=$src/conduit-extension.toml
    if [ ! -f "$manifest" ]; then
        echo "skipping examples/$name: it has no conduit-extension.toml" >&2
        continue
    fi
    dest=$out/$name
    rm -rf "$dest"
    if [ -f "$src/Cargo.toml" ]; then
        program=$(program_of "$manifest")
        case $program in
            "") echo "examples/$name/conduit-extension.toml: cannot read the program from \`command\` (write it on one line: command = [\"./binary\"])" >&2; exit 1 ;;
            */*) ;;
            *) echo "examples/$name: \`command\` names \`$program\`, looked up on PATH; a Rust example should run its own binary (\"./$program\")" >&2; exit 1 ;;
        esac
        binary=$bin_dir/$(basename "$program")
        if [ ! -x "$binary" ]; then
            echo "examples/$name: $binary is not built; run \`$build\` first" >&2
            exit 1
        fi
        mkdir -p "$dest/$(dirname "$program")"
        cp "$manifest" "$dest/conduit-extension.toml"
        cp "$binary" "$dest/$program"
    else
        cp -R "$src" "$dest"
        case $(basename "$(program_of "$manifest")") in
            python3 | python) "$root/scripts/vendor-sdk.sh" python "$dest" ;;
            node) "$root/scripts/vendor-sdk.sh" node "$dest" ;;
        esac
    fi
    echo "staged examples/$name -> $dest"
    staged=$((staged + 1))
done
if [ "$staged" -eq 0 ]; then
    echo "no example has a conduit-extension.toml; nothing staged" >&2
    exit 1
fi
