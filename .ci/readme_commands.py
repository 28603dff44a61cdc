"""Print the README's two commands (the ```sh blocks under "## Two commands"), one per line, as
written: .ci/run runs exactly these, so a README command that fails fails CI. Standard library only:
it runs before anything is installed."""

import re
import sys
from pathlib import Path

text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
section = re.search(r"^## Two commands\n(.*?)(?=^## )", text, re.S | re.M)
blocks = re.findall(r"^```sh\n(.*?)^```", section.group(1) if section else "", re.S | re.M)
commands = [" ".join(b.split("\\\n")).strip() for b in blocks]
if len(commands) != 2 or any("\n" in c or not c for c in commands):
    sys.exit("ci: README.md must hold exactly two one-line ```sh blocks under '## Two commands'")
print("\n".join(commands))
