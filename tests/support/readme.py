"""The README's "Deploy on Kubernetes" commands, for the tests that run them or check them."""

from __future__ import annotations

import re
import shlex

from tests.support.harness import ROOT

README = ROOT / "README.md"


def deploy_commands() -> list[str]:
    """Every command line in the shell blocks of the README's "Deploy on Kubernetes" section."""
    section = README.read_text().split("## Deploy on Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        lines += [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    return lines


def exported(commands: list[str]) -> dict[str, str]:
    """The plain `export NAME=value` lines (no quoting, no command substitution)."""
    return dict(re.fullmatch(r"export (\w+)=(\S+)", c).groups() for c in commands
                if re.fullmatch(r"export \w+=[^\"'\s$]+", c))


def deploy_argv(prefix: str, variables: dict[str, str]) -> list[str]:
    """The one README deploy command starting with `prefix`, its variables replaced, split."""
    (command,) = [c for c in deploy_commands() if c.startswith(prefix)]
    for name, value in variables.items():
        command = command.replace(f"${name}", value)
    return shlex.split(command)
