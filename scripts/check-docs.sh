#!/usr/bin/env bash
# The documentation check (`make check-docs`, part of `make test`). Offline, python3 only:
#
# 1. Links: every relative link (and image) in every Markdown file of the repository (tracked, or
#    new and not ignored) names a file or folder that exists inside the repository, never outside
#    it; a `#anchor` names a heading of its target page (GitHub's rule: lowercase, punctuation
#    dropped, spaces to '-', repeats numbered -1, -2, ...). Links in code blocks and code spans are
#    not links. Web links (https:, mailto:) are not fetched.
# 2. ARCHITECTURE.md: every path it names in backticks (`worker/src/settle.rs`, `store/cancel.rs`,
#    `jobs/`, `tests/tests/`) exists. A full path is taken from the repository's root; a short one
#    must be the end of an existing path under the folder of its row in the code map (the first
#    column: `worker/`), or, in the prose below the map, anywhere in the repository. A name counts
#    as a path when it ends in '/' or a known extension (.rs .sh .py .md .yml .yaml .json .toml .tpl
#    .txt .lock); `jobs::run`, `{tools}:ids` or `/readyz` are not paths.
#    Every invariant it states names the test that holds it: a paragraph starting `**Invariant:**`,
#    and each item of the list under the heading "Invariants across the fleet", says `tested by`
#    or `not yet tested`. Each name in backticks after `tested by` (up to its closing parenthesis)
#    must exist: `module` is a file tests/tests/fleet/<module>.rs; `module::test` is a function of
#    that file; `crate::path::test` (a crate: protocol, platform, dispatcher, worker, fleetctl,
#    tests) is a function of the file of that module (`crate/src/path.rs` or `path/mod.rs`, the
#    crate root for no path; a `tests` segment is the file's test module); a path
#    (`worker/tests/layers.rs`, `scripts/check-api.sh`) exists, and `path.rs::test` is a function
#    of it; a bare name that is no test module is a function of some .rs file under the crates.
# 3. Every other page: a backticked path that starts at one of the repository's top-level folders
#    (`tests/tests/fleet/batch.rs`, `scripts/check-api.sh`, `helm/agent-fleet`) exists. Files a reader
#    creates (KNOWN_ABSENT below) are exempt.
# 4. Every page under docs/ can be reached from README.md by following links.
#
# Prints each problem as file:line: what, and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os
import re
import subprocess
import sys
import unicodedata
from urllib.parse import unquote

ROOT = os.getcwd()
SKIP_DIRS = {".git", "target", "node_modules", ".fleet-run", ".schemathesis", "__pycache__"}
EXTS = {"rs", "sh", "py", "md", "yml", "yaml", "json", "toml", "tpl", "txt", "lock"}
# Paths the pages name on purpose although the repository does not hold them: files a reader makes.
KNOWN_ABSENT = {"deploy/.env"}
PATH_RE = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?$")
FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")
LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
HTML_ID_RE = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.I)
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

problems = []


def problem(path, line, what):
    problems.append(f"{path}:{line}: {what}")


def walk():
    """Every file and folder of the working tree (relative paths), but build output and caches."""
    files, dirs = set(), set()
    for here, subdirs, names in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        rel = os.path.relpath(here, ROOT)
        if rel != ".":
            dirs.add(rel.replace(os.sep, "/"))
        for name in names:
            files.add(os.path.normpath(os.path.join(rel, name)).replace(os.sep, "/"))
    return files, dirs


FILES, DIRS = walk()


def markdown_files():
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
            check=True, capture_output=True, text=True,
        ).stdout
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [f for f in FILES if f.endswith(".md")]
    return sorted(n for n in set(names) if os.path.isfile(n) and n.split("/")[0] not in SKIP_DIRS)


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE_RE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = text.replace("`", "").replace("*", "").replace("~", "")
    out = []
    for ch in text.lower():
        if ch == " ":
            out.append("-")
        elif ch in "-_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append(ch)
    return "".join(out)


ANCHORS = {}


def anchors(page):
    if page not in ANCHORS:
        seen, found = {}, set()
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for _, line in prose_lines(text):
            found.update(HTML_ID_RE.findall(line))
            m = HEADING_RE.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        ANCHORS[page] = found
    return ANCHORS[page]


def without_code_spans(line):
    return CODE_SPAN_RE.sub(lambda m: "code", line)


def code_spans(line):
    return [m.group(2).strip() for m in CODE_SPAN_RE.finditer(line)]


# 1. Links and anchors; the link graph for 4.
pages = markdown_files()
links_checked = 0
graph = {}
for page in pages:
    with open(page, encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(page)
    graph[page] = set()
    for number, line in prose_lines(text):
        bare = without_code_spans(line)
        targets = [m.group(1) for m in LINK_RE.finditer(bare)]
        m = REF_DEF_RE.match(bare)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if not target or SCHEME_RE.match(target) or target.startswith("//"):
                continue
            links_checked += 1
            path, _, anchor = target.partition("#")
            path = unquote(path.split("?")[0])
            if path:
                base = ROOT if path.startswith("/") else os.path.join(ROOT, here)
                resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
                rel = os.path.relpath(resolved, ROOT).replace(os.sep, "/")
                if rel == ".." or rel.startswith("../"):
                    problem(page, number, f"link {target!r} points outside the repository")
                    continue
                if not os.path.exists(resolved):
                    problem(page, number, f"link {target!r}: no such file or folder ({rel})")
                    continue
            else:
                rel = page
            if rel.endswith(".md"):
                graph[page].add(rel)
            if anchor and rel.endswith(".md") and os.path.isfile(rel):
                if unquote(anchor).lower() not in anchors(rel):
                    problem(page, number, f"link {target!r}: {rel} has no heading with the anchor #{anchor}")


def is_path(token):
    if not PATH_RE.match(token) or token.startswith("/"):
        return False
    if token.endswith("/"):
        return True
    name = token.rsplit("/", 1)[-1]
    return "." in name and name.rsplit(".", 1)[1] in EXTS


def exists_under(token, roots):
    """Whether `token` names an existing file or folder: from the root, or ending a path under one of
    `roots` ('' is the whole repository)."""
    t = token.rstrip("/")
    if (token.endswith("/") and t in DIRS) or (not token.endswith("/") and (t in FILES or t in DIRS)):
        return True
    pool = DIRS if token.endswith("/") else FILES | DIRS
    for root in roots:
        prefix = root.rstrip("/") + "/" if root else ""
        for p in pool:
            if p.startswith(prefix) and (p == prefix + t or p.endswith("/" + t)):
                return True
    return False


# 2. The paths ARCHITECTURE.md names.
arch_checked = 0
if os.path.isfile("ARCHITECTURE.md"):
    with open("ARCHITECTURE.md", encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        roots = [""]
        if line.lstrip().startswith("|"):
            cells = line.strip().strip("|").split("|")
            folders = [t for t in code_spans(cells[0]) if t.endswith("/") and t.rstrip("/") in DIRS]
            if folders:
                roots = folders
        for token in code_spans(line):
            if not is_path(token):
                continue
            arch_checked += 1
            if not exists_under(token, roots):
                where = " or under ".join(roots) if roots != [""] else "anywhere below it"
                problem("ARCHITECTURE.md", number,
                        f"names `{token}`, found neither from the repository's root nor {'under ' if roots != [''] else ''}{where}")

# 2b. Every invariant of ARCHITECTURE.md names the test that holds it, and that test exists.
CRATES = ("protocol", "platform", "dispatcher", "worker", "fleetctl", "tests")
FLEET_SUITE = "tests/tests/fleet"
INVARIANT_RE = re.compile(r"^\*\*(?:Architecture )?Invariant:\*\*")
LIST_ITEM_RE = re.compile(r"^\s{0,3}[-*+]\s+")
FN_CACHE = {}


def functions(path):
    """The names of the functions a .rs file defines (`fn name`, whatever precedes it)."""
    if path not in FN_CACHE:
        try:
            with open(path, encoding="utf-8") as f:
                FN_CACHE[path] = set(re.findall(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", f.read()))
        except OSError:
            FN_CACHE[path] = set()
    return FN_CACHE[path]


def crate_sources():
    return sorted(f for f in FILES if f.endswith(".rs") and f.split("/")[0] in CRATES)


def module_file(crate, segments):
    """The file of module `segments` of `crate` (a trailing `tests` segment is a file's own test
    module), or None."""
    if segments and segments[-1] == "tests":
        segments = segments[:-1]
    if not segments or segments in (["lib"], ["main"]):
        candidates = [f"{crate}/src/lib.rs", f"{crate}/src/main.rs"]
    else:
        base = f"{crate}/src/" + "/".join(segments)
        candidates = [base + ".rs", base + "/mod.rs"]
    return next((c for c in candidates if c in FILES), None)


def test_problem(name):
    """What is wrong with the test `name` an invariant says holds it, or None."""
    if "::" not in name and is_path(name):
        return None if exists_under(name, [""]) else f"`{name}`: no such file or folder"
    if "::" in name and "/" in name:
        path, _, fn = name.rpartition("::")
        if path not in FILES:
            return f"`{name}`: no such file {path}"
        return None if fn in functions(path) else f"`{name}`: {path} has no `fn {fn}`"
    segments = name.split("::")
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s) for s in segments):
        return f"`{name}` is neither a test module, a test nor a path"
    module = f"{FLEET_SUITE}/{segments[0]}.rs"
    if len(segments) == 1 and module in FILES:
        return None
    if len(segments) == 2 and module in FILES:
        return None if segments[1] in functions(module) else f"`{name}`: {module} has no `fn {segments[1]}`"
    if len(segments) >= 2 and segments[0] in CRATES:
        found = module_file(segments[0], segments[1:-1])
        if found is None:
            return f"`{name}`: the crate {segments[0]} has no module {'::'.join(segments[1:-1]) or '(root)'}"
        return None if segments[-1] in functions(found) else f"`{name}`: {found} has no `fn {segments[-1]}`"
    if len(segments) == 1:
        if any(segments[0] in functions(f) for f in crate_sources()):
            return None
        return f"`{name}`: neither {module} nor a function of that name in the crates"
    return f"`{name}`: {segments[0]} is neither a test module under {FLEET_SUITE}/ nor a crate"


def invariants(text):
    """(line number, text) of every invariant: a paragraph starting `**Invariant:**`, and each list
    item under the heading "Invariants across the fleet"."""
    found, current, in_list_section, list_level = [], None, False, 0
    for number, line in prose_lines(text):
        heading = HEADING_RE.match(line)
        if heading:
            if current:
                found.append(current)
            current = None
            level = len(heading.group(1))
            if slug(heading.group(2)) == "invariants-across-the-fleet":
                in_list_section, list_level = True, level
            elif in_list_section and level <= list_level:
                in_list_section = False
            continue
        if not line.strip():
            if current:
                found.append(current)
            current = None
            continue
        starts = INVARIANT_RE.match(line.lstrip()) or (in_list_section and LIST_ITEM_RE.match(line))
        if starts:
            if current:
                found.append(current)
            current = [number, line.strip()]
        elif current and not LIST_ITEM_RE.match(line):
            current[1] += " " + line.strip()
        elif current:
            found.append(current)
            current = None
    if current:
        found.append(current)
    return found


def tested_by(statement):
    """The backticked names after each `tested by`, up to the closing parenthesis (or the end)."""
    names = []
    for m in re.finditer(r"tested by", statement):
        rest, depth, end = statement[m.end():], 0, None
        spans = [(s.start(), s.end()) for s in CODE_SPAN_RE.finditer(rest)]
        for i, ch in enumerate(rest):
            if any(a <= i < b for a, b in spans):
                continue
            if ch == "(":
                depth += 1
            elif ch == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
        names.append(code_spans(rest[:end]))
    return names


invariants_checked = invariants_untested = 0
if os.path.isfile("ARCHITECTURE.md"):
    with open("ARCHITECTURE.md", encoding="utf-8") as f:
        text = f.read()
    for number, statement in invariants(text):
        invariants_checked += 1
        lists = tested_by(statement)
        untested = "not yet tested" in statement
        invariants_untested += untested and not lists
        if not lists and not untested:
            problem("ARCHITECTURE.md", number,
                    "an invariant names no test: add (tested by `module::test`) or (not yet tested)")
        for names in lists:
            if not names:
                problem("ARCHITECTURE.md", number, "says `tested by` but names no test in backticks after it")
            for name in names:
                why = test_problem(name)
                if why:
                    problem("ARCHITECTURE.md", number, f"an invariant's test {why}")

# 3. Full paths named by every other page.
TOP = {d for d in DIRS if "/" not in d}
paths_checked = 0
for page in pages:
    if page == "ARCHITECTURE.md":
        continue
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for token in code_spans(line):
            if "/" not in token or not PATH_RE.match(token) or token.split("/")[0] not in TOP:
                continue
            if token.rstrip("/") in KNOWN_ABSENT:
                continue
            paths_checked += 1
            if not os.path.exists(token):
                problem(page, number, f"names `{token}`, which does not exist")

# 4. Every page under docs/ reachable from README.md.
reached, todo = set(), ["README.md"] if "README.md" in graph else []
while todo:
    page = todo.pop()
    if page in reached:
        continue
    reached.add(page)
    todo.extend(graph.get(page, ()))
for page in pages:
    if page.startswith("docs/") and page not in reached:
        problem(page, 1, "cannot be reached from README.md by following links")

# 5. Every module of the cross-process suite has its row in docs/testing.md's table.
testing = open("docs/testing.md", encoding="utf-8").read()
suite = "tests/tests/fleet"
modules = sorted(f[:-3] for f in os.listdir(suite) if f.endswith(".rs") and f != "main.rs")
for module in modules:
    if not re.search(r"^\| [^|]*`" + re.escape(module) + r"`[^|]*\|", testing, re.M):
        problem("docs/testing.md", 1, f"has no row for the test module `{module}` ({suite}/{module}.rs)")

for p in problems:
    print(p)
summary = (f"{len(pages)} Markdown files, {links_checked} links, {arch_checked} paths in ARCHITECTURE.md, "
           f"{invariants_checked} invariants ({invariants_untested} not yet tested), "
           f"{paths_checked} repository paths elsewhere, {len(modules)} test modules")
if problems:
    sys.stdout.flush()
    print(f"check-docs: {len(problems)} problem(s) ({summary})", file=sys.stderr)
    sys.exit(1)
print(f"check-docs: ok ({summary})")
PY
