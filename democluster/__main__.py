"""`python -m democluster up|down|status`: the embedded one-machine cluster (make demo, make stop).

Run from the checkout: the demo is not part of the installed package, and it reads the checkout's
config/portal.yaml (or --config, else $DSPORTAL_CONFIG)."""

from __future__ import annotations

import argparse
import sys

import democluster as demo
from portal.core import settings as settings_module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m democluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="portal.yaml (default: $DSPORTAL_CONFIG, else the checkout's "
                        "config/portal.yaml)")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--images-later", action="store_true",
                        help="up: leave unbuilt images to scripts/build-extras.sh (make demo builds them in the "
                             "background, while the portal serves)")
    args = parser.parse_args(argv)
    config = settings_module.config_path(args.config, demo=True)  # the demo's own file by default
    try:
        if args.action == "up":
            config = demo.release_config(config)  # make demo SLURM=RELEASE: that release's commands
            demo.up(config, images_later=args.images_later)
            print(demo.banner(settings_module.load(config)))
        elif args.action == "down":
            demo.down()
        else:
            for name, running in demo.status().items():
                print(f"  {name:<14} {'running' if running else 'stopped'}")
    except demo.DemoError as error:
        print(f"python -m democluster {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
