"""`skiplock --help` and every subcommand's `--help`, found by walking the parser: each exits 0
with its usage and the help of its options, and every command a user can type has help text."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from skiplock.cli import main, parser


def _commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(parser()))


def test_the_walk_finds_every_group():
    top = {path[0] for path in COMMANDS if path}
    assert {"migrate", "worker", "scheduler", "api", "dispatcher", "webhooks", "deliveries", "schedules", "workers",
            "tasks", "queues", "kinds", "audit", "limits", "tokens", "dev", "enqueue"} <= top
    assert ("tasks", "list") in COMMANDS and ("limits", "apply") in COMMANDS


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda path: " ".join(path) or "skiplock")
def test_help_exits_0_with_its_usage(path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join(('skiplock', *path))}")
    assert "-h, --help" in out


def test_every_command_says_what_it_does():
    missing = []
    for p in COMMANDS.values():
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                missing += [f"{p.prog} {name}" for name in action.choices if name not in helped]
    assert missing == []


def test_the_command_runs_as_a_process():
    done = subprocess.run([sys.executable, "-m", "skiplock.cli", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: skiplock") and "tasks" in done.stdout
