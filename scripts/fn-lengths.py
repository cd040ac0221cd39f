#!/usr/bin/env python3
"""List Rust functions in crates/*/src whose body is longer than a limit (default 100 lines).

The project rule (docs/architecture.md, "A thin binary"): a logic function that grows past the limit is
split into named steps. Exempt:
  * test code: files under tests/ or benches/, `#[cfg(test)]` modules, `#[test]` functions;
  * fixture crates (FIXTURE_CRATES below, each with its reason);
  * data tables: a function whose body is one table literal (an array/slice/vec! literal, or a
    `match` whose every arm is a literal) is detected as such, and a function can be allowlisted
    with a comment `// fn-lengths: table — <reason>` on one of the three lines above its `fn`.

Usage: scripts/fn-lengths.py [--limit N] [--check] [ROOT]
  --check  exit 1 when any function is over the limit (scripts/test.sh runs it so).
Output: one line per function, longest first: `LINES  path:line  name`.
"""
import argparse
import os
import re
import sys

FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                   r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")
ALLOW_RE = re.compile(r"//\s*fn-lengths:\s*table\b")
# Crates whose every function is a test fixture (builders of synthetic models), with the reason.
FIXTURE_CRATES = {
    "ork-testkit": "dev-only crate: builders of synthetic GGUF/pack fixtures for tests",
}


def strip_code(text):
    """Blank out comments, string and char literals, keeping newlines, so braces can be counted."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 40]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            close = '"' + m.group(1)
            j = text.find(close, i + len(m.group(0)))
            j = n if j < 0 else j + len(close)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "'":
            # char literal ('x', '\n', '\u{..}') vs lifetime ('a)
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_table(body_lines):
    """A body that is one literal: every non-blank line is a literal element, or an array/match."""
    code = [l.strip() for l in body_lines if l.strip()]
    if not code:
        return False
    lit = re.compile(r"^(\[|\]|\(|\)|\{|\}|vec!\[|&\[|match\b|[-0-9.x_a-fA-F,\s\[\]()]+$|.*=>\s*[-0-9.\"'A-Za-z_:]+,?$)")
    return sum(1 for l in code if lit.match(l)) >= 0.9 * len(code)


def functions(path):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    raw_lines = raw.split("\n")
    lines = strip_code(raw).split("\n")
    test_depth = None  # brace depth at which a #[cfg(test)] item started
    depth = 0
    pending_test = False
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = raw_lines[i].strip()
        if stripped.startswith("#[cfg(test)]") or stripped.startswith("#[test]"):
            pending_test = True
        m = FN_RE.match(line)
        if m and test_depth is None and not pending_test:
            # find the opening brace of the body (or a `;` for a declaration)
            j, col = i, line.find("fn ")
            start = None
            while j < len(lines):
                seg = lines[j][col:] if j == i else lines[j]
                b, s = seg.find("{"), seg.find(";")
                if b >= 0 and (s < 0 or b < s):
                    start = j
                    break
                if s >= 0:
                    break
                j += 1
            if start is not None:
                d, k = 0, start
                end = None
                while k < len(lines):
                    seg = lines[k][col:] if k == i else lines[k]
                    for ch in seg:
                        if ch == "{":
                            d += 1
                        elif ch == "}":
                            d -= 1
                            if d == 0:
                                end = k
                                break
                    if end is not None:
                        break
                    k += 1
                if end is not None:
                    length = end - i + 1
                    allow = any(ALLOW_RE.search(raw_lines[x]) for x in range(max(0, i - 3), i))
                    table = is_table(raw_lines[start + 1:end])
                    yield m.group(1), i + 1, length, allow or table
        for ch in line:
            if ch == "{":
                if pending_test and test_depth is None:
                    test_depth = depth
                    pending_test = False
                depth += 1
            elif ch == "}":
                depth -= 1
                if test_depth is not None and depth == test_depth:
                    test_depth = None
        if pending_test and line.strip().endswith(";"):
            pending_test = False
        i += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--all", action="store_true", help="also list exempt (table) functions")
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    args = ap.parse_args()
    crates = os.path.join(args.root, "crates")
    found = []
    for crate in sorted(os.listdir(crates)):
        if crate in FIXTURE_CRATES:
            continue
        src = os.path.join(crates, crate, "src")
        for dirpath, _, files in os.walk(src):
            if os.sep + "tests" in dirpath[len(src):]:
                continue
            for name in files:
                if not name.endswith(".rs") or name == "tests.rs":
                    continue
                path = os.path.join(dirpath, name)
                for fn, line, length, exempt in functions(path):
                    if length > args.limit and (args.all or not exempt):
                        rel = os.path.relpath(path, args.root)
                        found.append((length, f"{rel}:{line}", fn + (" (table)" if exempt else "")))
    for length, where, fn in sorted(found, reverse=True):
        print(f"{length:5}  {where}  {fn}")
    over = [f for f in found if "(table)" not in f[2]]
    sys.stdout.flush()
    print(f"{len(over)} function(s) over {args.limit} lines", file=sys.stderr)
    if args.check and over:
        print("error: split each function listed above into named steps (docs/architecture.md, "
              "\"A thin binary\"), or mark a data table as this script's header says",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
