#!/usr/bin/env python3
"""Prints charts/skiplock as `helm install skiplock charts/skiplock --namespace skiplock` would
install it, with no cluster and no `helm` binary: Helm's own engine (helm-python, Helm v4's Go
code, one of the test extras) renders it and applies the chart's values.schema.json. `make chart`
runs it.

    render_chart.py [-f VALUES.yaml]... [--set key=value]...

Values are layered as Helm layers them: the chart's values.yaml, then each -f file in order, then
each --set in order (Helm's own syntax: `a.b=1,c={x,y}`, typed as Helm types them). Stdout is one
YAML stream: the manifests as `helm template` prints them (`---` and `# Source:` before each),
in the order of their templates' paths, then the NOTES that `helm install` prints, as comment lines.
A values file that is missing or not YAML, a malformed --set, values the schema refuses or a
template's own refusal: one line on stderr and exit 1.

The chart tests render with these functions (tests/chart/rendering.py), so what this prints is what
they check. Nothing here talks to a cluster or the network: `lookup` finds nothing, so the secrets
the chart generates are new at each render.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "skiplock"
RELEASE = "skiplock"
NAMESPACE = "skiplock"
NOTES = "NOTES.txt"


class BadValues(Exception):
    """Values this render cannot use; the message is one line naming where they came from."""


def merge(base: dict, over: dict) -> dict:
    """`over` laid on `base` as Helm lays a values file on the ones before it: maps merge key by key,
    anything else is replaced. Neither argument changes."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = merge(below, value) if isinstance(value, dict) and isinstance(below, dict) else copy.deepcopy(value)
    return out


def _one_line(detail: str) -> str:
    """Helm's message on one line. A schema refusal lists one problem per `- ` line under a header
    naming the chart: those problems, joined."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    problems = [line[2:] for line in lines if line.startswith("- ")]
    if problems and lines[0].startswith("values don't meet the specifications"):
        return f"refused by {CHART.relative_to(ROOT)}/values.schema.json: " + "; ".join(problems)
    return "; ".join(lines)


def user_values(files: list[str], sets: list[str]) -> dict:
    """The values a `helm install -f FILE... --set EXPR...` gives, before the chart's defaults."""
    import helm_python as helm

    values: dict = {}
    for name in files:
        try:
            text = Path(name).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadValues(f"{name}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            values = merge(values, helm.values_from_yaml(text))
        except helm.HelmError as exc:
            detail = re.sub(r"^error converting YAML to JSON: ", "not valid YAML: ", exc.detail)
            detail = re.sub(r"^error unmarshaling JSON: .*cannot unmarshal (\w+) into .*",
                            r"holds a YAML \1, not a map of values", detail)
            raise BadValues(f"{name}: {_one_line(detail)}") from None
    for expression in sets:
        try:
            values = merge(values, helm.parse_set_string(expression))
        except helm.HelmError as exc:
            raise BadValues(f"--set {expression}: {_one_line(exc.detail)}") from None
    return values


def render(values: dict | None = None, *, is_upgrade: bool = False) -> dict[str, str]:
    """{template path: rendered text}; raises helm_python's errors on a schema or template failure."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE,
                            is_install=not is_upgrade, is_upgrade=is_upgrade)


def stream(rendered: dict[str, str]) -> str:
    """The manifests as `helm template` prints them (empty documents dropped), then the NOTES as
    comments, so that the whole still parses as YAML."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("/" + NOTES):
            continue
        for document in re.split(r"(?m)^---[ \t]*$", text):
            if document.strip():
                out.append(f"---\n# Source: {path}\n{document.strip()}\n")
    notes = next((text for path, text in rendered.items() if path.endswith("/" + NOTES)), "")
    if notes.strip():
        out.append(f"# {NOTES}, as `helm install` prints it after installing:\n"
                   + "".join(f"# {line}".rstrip() + "\n" for line in notes.strip().splitlines()))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print charts/skiplock rendered by Helm's engine, "
                                                 "as `helm install` would install it, and its NOTES.")
    parser.add_argument("-f", "--values", dest="files", action="append", default=[], metavar="FILE",
                        help="a values file, laid on the chart's defaults (repeatable, in order)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="key=value",
                        help="values in Helm's --set syntax, after the files (repeatable, in order)")
    args = parser.parse_args(argv)
    try:
        import helm_python as helm
    except ImportError:
        print("chart: helm-python is not installed: `make chart` installs it", file=sys.stderr)
        return 1
    try:
        rendered = render(user_values(args.files, args.sets))
    except BadValues as exc:
        print(f"chart: {exc}", file=sys.stderr)
        return 1
    except helm.HelmError as exc:
        print(f"chart: {_one_line(exc.detail)}", file=sys.stderr)
        return 1
    sys.stdout.write(stream(rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())
