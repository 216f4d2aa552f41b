#!/usr/bin/env bash
# make-man.sh STOKER OUT: writes the man page stoker(1) to OUT from the tool's
# own `--help` and `version` output, so the page says what the binary does and
# cannot drift from it (help2man's idea, without its dependency). `make
# install` runs it and installs the page as $(mandir)/man1/stoker.1.
set -euo pipefail
tool=$1
out=$2
help=$("$tool" --help)
version=$("$tool" version)
version=${version#stoker }

# roff: a backslash is \e, a hyphen that must stay an ASCII minus (options,
# paths) is \-, and a line starting with . or ' needs \& in front.
esc() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\([.']\)/\\\\\&\1/"; }

# The usage block is everything before the first empty line.
synopsis=$(printf '%s\n' "$help" | sed -n '1,/^$/p' | sed -e '/^$/d' -e 's/^usage: //' -e 's/^       //')
description=$(printf '%s\n' "$help" | sed -n '/^$/,$p' | sed -e '1d')

{
    printf '.TH STOKER 1 "" "stoker %s" "User Commands"\n' "$version"
    printf '.SH NAME\n'
    printf 'stoker \\- iterate, pack, inspect and verify datasets with the stoker data-loading engine\n'
    printf '.SH SYNOPSIS\n.nf\n'
    printf '%s\n' "$synopsis" | esc
    printf '.fi\n.SH DESCRIPTION\n.nf\n'
    printf '%s\n' "$description" | esc
    printf '.fi\n'
    printf '.SH EXIT STATUS\n'
    printf '0 on success; 1 when the dataset cannot be opened or a sample fails (the\n'
    printf 'message on standard error names the sample and the reason); 2 for bad usage.\n'
    printf '.SH SEE ALSO\n'
    printf 'The documentation installed with stoker (share/doc/stoker: cli.md,\n'
    printf 'shards.md, remote.md, transforms.md, python.md, c\\-api.md), and the header\n'
    printf 'stoker.h for the C API.\n'
} >"$out"
