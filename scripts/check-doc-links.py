#!/usr/bin/env python3
"""Checks every relative link in README.md and docs/*.md (the docs `make
install` copies): a Markdown link [text](target) or <img src=...> whose
target is not a URL must name a file or directory of the repository, and its
#anchor, when it has one, a heading of the Markdown file it names (GitHub's
anchors). A path to a .md file written in the text (`docs/engine.md`,
`../shared/STYLE.md`) must exist too, relative to the file or to the
repository root, so prose never sends a reader to a file that is not there.

Prints each broken link as FILE:LINE: TARGET: why, and closes with
"docs-links: N passed, N failed". Exit status 1 when any failed.

    scripts/check-doc-links.py [ROOT]     (ROOT: the repository, default ..)
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SRC = re.compile(r"""<(?:img|a)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""", re.I)
# A path to a Markdown file in prose or code spans: name.md, dir/name.md,
# ../dir/name.md (no scheme, not part of a URL).
MD_PATH = re.compile(r"(?<![\w/:.#-])((?:\.\.?/)*(?:[\w.-]+/)*[\w.-]+\.md)\b(?!\w)")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation other
    than '-' and '_' dropped, spaces to '-'."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # links: their text
    h = h.lower().replace("`", "")
    h = re.sub(r"<[^>]+>", "", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


_anchors = {}


def anchors(path):
    """The anchors of a Markdown file's headings (duplicates get -1, -2...)."""
    if path not in _anchors:
        seen, out, fenced = {}, set(), False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    s = slug(m.group(1))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    out.add(s if n == 0 else f"{s}-{n}")
                for a in re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", line):
                    out.add(a)
        _anchors[path] = out
    return _anchors[path]


def is_url(t):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) is not None


def check_target(root, md, target):
    """None if target (from md) resolves, else why not."""
    path, _, frag = target.partition("#")
    if not path:
        dest = md
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(md), path))
        if not os.path.exists(dest):
            return "no such file"
        if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
            return "outside the repository"
    if frag and dest.endswith(".md") and os.path.isfile(dest):
        if frag not in anchors(dest):
            return f"no heading with anchor #{frag} in {os.path.relpath(dest, root)}"
    return None


def check_file(root, md):
    failed, passed = [], 0
    fenced = False
    with open(md, encoding="utf-8") as f:
        lines = f.readlines()
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        targets = []
        if not fenced:
            targets += LINK.findall(line) + SRC.findall(line)
            m = REF_DEF.match(line)
            if m:
                targets.append(m.group(1))
        for t in targets:
            if is_url(t):
                continue
            why = check_target(root, md, t)
            if why:
                failed.append(f"{os.path.relpath(md, root)}:{no}: {t}: {why}")
            else:
                passed += 1
        # Paths to .md files named in the text, fenced blocks included.
        linked = set(t.partition("#")[0] for t in targets)
        for p in MD_PATH.findall(line):
            if p in linked or any(p in t for t in targets if is_url(t)):
                continue
            if re.search(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S*" + re.escape(p), line):
                continue  # part of a URL
            here = os.path.normpath(os.path.join(os.path.dirname(md), p))
            top = os.path.normpath(os.path.join(root, p))
            inside = [x for x in (here, top)
                      if os.path.realpath(x).startswith(os.path.realpath(root) + os.sep)]
            if any(os.path.exists(x) for x in inside):
                passed += 1
            else:
                failed.append(f"{os.path.relpath(md, root)}:{no}: {p}: "
                              "names a file that is not in the repository")
    return passed, failed


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    passed, failed = 0, []
    for md in files:
        if not os.path.isfile(md):
            failed.append(f"{os.path.relpath(md, root)}: missing")
            continue
        p, f = check_file(root, md)
        passed += p
        failed += f
    for line in failed:
        print(line)
    print(f"docs-links: {passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
