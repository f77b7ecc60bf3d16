#!/usr/bin/env python3
"""Copies the findings of the published comparison (reports/comparison/README.md, computed by
`allocbench report` from the committed results) into README.md's findings block, so the README
opens its report section with them; numbers are never typed. scripts/publish.sh runs it;
tests/readme.rs fails when the two lists differ.

    python3 scripts/readme_findings.py
"""
import os
import sys

BEGIN, END = "<!-- findings:begin (scripts/readme_findings.py) -->", "<!-- findings:end -->"


def findings(report_md):
    lines = report_md.splitlines()
    start = lines.index("## Findings") + 1
    out = []
    for line in lines[start:]:
        if line.startswith("## "):
            break
        if line.startswith("- "):
            out.append(line)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "reports", "comparison", "README.md")) as f:
        items = findings(f.read())
    if not items:
        print("reports/comparison/README.md has no findings: run scripts/publish.sh", file=sys.stderr)
        return 1
    path = os.path.join(root, "README.md")
    with open(path) as f:
        readme = f.read()
    if BEGIN not in readme or END not in readme:
        print(f"README.md has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = BEGIN + "\n" + "\n".join(items) + "\n" + END
    with open(path, "w") as f:
        f.write(head + block + tail)
    print(f"README.md: {len(items)} findings from reports/comparison/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
