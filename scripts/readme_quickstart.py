#!/usr/bin/env python3
"""Rewrites the quick-start block of README.md (numbers are never typed): how the shipped GPT-3 XL
capture was made (the arguments scripts/capture_workloads.sh gives it) and what
`allocbench diagnose` prints for it on a 73 GiB card, exactly as printed.

    python3 scripts/readme_quickstart.py [path/to/allocbench]

tests/readme.rs fails when the README's block differs from what `allocbench diagnose` prints.
"""
import os
import re
import subprocess
import sys

BEGIN, END = "<!-- quickstart:begin (scripts/readme_quickstart.py) -->", "<!-- quickstart:end -->"
NAME = "gpt3-xl-1.3b"
TRACE = f"workloads/captured/{NAME}.csv.gz"
CAPACITY = "73GiB"


def capture_command(root):
    """The capture of TRACE as scripts/capture_workloads.sh runs it: its environment and the
    train.py arguments of its case for NAME."""
    script = open(os.path.join(root, "scripts", "capture_workloads.sh")).read()
    env = re.findall(r"^export (TORCH_\w+=\S+)$", script, re.M)
    args = re.search(rf"^\s*{re.escape(NAME)}\) args=\((.*)\) ;;$", script, re.M)
    if not args or 'capture --backend fake-tensors -o "$tmp" -- scripts/models/train.py "${args[@]}"' not in script:
        sys.exit(f"readme_quickstart.py: scripts/capture_workloads.sh no longer captures {NAME} with train.py")
    return " ".join(env + ["allocbench", "capture", "--backend", "fake-tensors", "-o", f"{NAME}.csv", "--", "scripts/models/train.py", args.group(1)])


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(root, "target", "release", "allocbench")
    diagnose = ["diagnose", TRACE, "--capacity", CAPACITY]
    out = subprocess.run([exe] + diagnose, capture_output=True, text=True, check=True, cwd=root).stdout.strip("\n")
    block = "\n".join(
        [
            BEGIN,
            f"The shipped trace `{TRACE}` is such a capture, made without a GPU by",
            "`scripts/capture_workloads.sh` (then gzip-compressed):",
            "",
            "```sh",
            capture_command(root),
            "```",
            "",
            f"On a {CAPACITY[:-3]} GiB card, `allocbench {' '.join(diagnose)}` prints:",
            "",
            "```",
            out,
            "```",
            END,
        ]
    )
    readme = os.path.join(root, "README.md")
    text = open(readme).read()
    if BEGIN not in text or END not in text:
        sys.exit(f"readme_quickstart.py: README.md has no {BEGIN} ... {END} block")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    open(readme, "w").write(text[:start] + block + text[end:])
    print(block)


if __name__ == "__main__":
    main()
