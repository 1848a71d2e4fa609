"""How the suite runs on several cores (pytest-xdist; tests/conftest.py wires it in).

* Order: under xdist, the tests of tests/durations.txt (measured seconds, slowest first) start
  first, the longest before the shorter, and every other test follows in collection order: a
  worker that picks up a 30 s test near the end would otherwise keep the run going alone. A
  serial run keeps pytest's own order.
* Scheduling (`--dist loadgroup`): as xdist's own loadgroup, one test at a time to whichever worker
  is free, except that the modules of ONE_WORKER_MODULES go to one worker whole. xdist's
  `xdist_group` mark is not used: with pytest 9.2 it no longer reaches the scheduler (xdist 3.8
  renames `item._nodeid`, which pytest no longer reads), and the tests would be split silently.

pyproject.toml's addopts run `-n 4 --dist loadgroup` (4 workers on 2 cores: most tests wait on
processes, sleeps and Postgres); `-n0` runs everything in one process. Refresh tests/durations.txt
after a change in what is slow: `.venv/bin/python -m pytest --write-durations` rewrites it.
"""

from __future__ import annotations

from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.txt"
# at least this long (setup + call + teardown, seconds) to be listed in the durations file
LISTED_FROM = 1.0

# Modules whose tests share a module-scoped fixture that must exist once per run: one worker runs
# them all, one after the other.
ONE_WORKER_MODULES = (
    "tests/image/test_container.py",  # builds and pushes the image once (80 s); two builds would clash
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """{nodeid: seconds} from lines 'seconds nodeid' ('#' starts a comment)."""
    durations: dict[str, float] = {}
    if not path.is_file():
        return durations
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            seconds, _, nodeid = line.partition(" ")
            durations[nodeid.strip()] = float(seconds)
    return durations


def write_durations(measured: dict[str, float], path: Path = DURATIONS) -> None:
    header = ("# Seconds per test (setup + call + teardown) of one run, slowest first: under xdist these start\n"
              "# first (tests/support/parallel.py). Rewritten by `python -m pytest --write-durations`.\n")
    rows = sorted(((s, n) for n, s in measured.items() if s >= LISTED_FROM), key=lambda r: (-r[0], r[1]))
    path.write_text(header + "".join(f"{s:.1f} {n}\n" for s, n in rows))


def slowest_first(items: list, durations: dict[str, float]) -> list:
    """`items` with the known-slow ones first, longest first; a ONE_WORKER_MODULES module counts
    as one unit (the sum of its tests) and keeps its tests together, in their order; the rest
    keep their order (a stable sort)."""
    def unit(item) -> str:
        module = module_of(item.nodeid)
        return module if module in ONE_WORKER_MODULES else item.nodeid

    seconds: dict[str, float] = {}
    for item in items:
        seconds[unit(item)] = seconds.get(unit(item), 0.0) + durations.get(item.nodeid, 0.0)
    return sorted(items, key=lambda item: -seconds[unit(item)])


def make_scheduler(config, log):
    """`--dist loadgroup`: xdist's LoadGroupScheduling, with ONE_WORKER_MODULES as groups."""
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = module_of(nodeid)
            if module in ONE_WORKER_MODULES:
                return module
            return super()._split_scope(nodeid)

    return ModuleGroupScheduling(config, log)
