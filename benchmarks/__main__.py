"""python -m benchmarks SCENARIO [options]: run one benchmark scenario (benchmarks/README.md).

Scenarios: targets, schema and erase (make benchmark), scale (make benchmark-scale), state (make benchmark-state), many
(make benchmark-many). `python -m benchmarks SCENARIO --help` lists a scenario's measurements and options.
Run it from the repository's root with the project's .venv.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks.harness import RESULTS, run

SCENARIOS = {"targets": "benchmarks.targets", "scale": "benchmarks.scale", "state": "benchmarks.state", "many": "benchmarks.many_tables",
             "schema": "benchmarks.schema", "erase": "benchmarks.erase"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenarios = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, module_name in SCENARIOS.items():
        module = importlib.import_module(module_name)
        sub = scenarios.add_parser(name, help=module.__doc__.splitlines()[0].split(": ", 1)[1], description=module.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.add_argument("--workdir", help="default: a fresh temp dir, deleted at the end unless --keep (a failed run's logs stay)")
        sub.add_argument("--keep", action="store_true", help="keep the workdir: data, warehouses, logs")
        sub.add_argument("--results-dir", default=str(RESULTS), help=f"where the JSON results go (default {RESULTS}; '' for none)")
        sub.set_defaults(module=module, parser=sub)
    args = parser.parse_args(argv)
    args.module.check_arguments(args.parser, args)
    del args.parser
    return run(args.module, args)


if __name__ == "__main__":
    sys.exit(main())
