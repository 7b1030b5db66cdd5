"""The `dsportal` command: hub [move-database|install-units|...], check, images, templates
list|check, firewall, usage, docs portal-yaml.

Every command reads --config, else $DSPORTAL_CONFIG, else /etc/dsportal/portal.yaml, and refuses the
demo's settings unless DSPORTAL_DEMO=1 (portal/core/settings.py: config_path, refuse_demo)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from importlib import resources
from pathlib import Path

from portal.admin import firewall, hubaccount, templatecheck, usage
from portal.admin.check import run_checks
from portal.core import images, settings as settings_module, settingsdoc
from portal.core.templatesources import notebooks
from portal.slurm.slurmclient import CATCHING_UP, SlurmCommands


def _hub_config_file() -> str:
    checkout = Path(__file__).resolve().parents[1] / "config" / "jupyterhub_config.py"
    if checkout.exists():
        return str(checkout)
    return str(resources.files("dsportal_config") / "jupyterhub_config.py")


def production_settings(args):
    """portal.yaml for a production command (the hub, check, images, templates, usage): --config, else
    $DSPORTAL_CONFIG, else /etc/dsportal/portal.yaml; never the demo's unless DSPORTAL_DEMO=1."""
    settings = settings_module.load(args.config)
    settings_module.refuse_demo(settings)
    return settings


def cmd_hub(args) -> int:
    if args.action == "install-units":  # the shipped files only: no portal.yaml needed
        return install_units(args.dest, args.force, hubaccount.LOGIN_UNITS, "hub install-units")
    settings = production_settings(args)  # fail here, naming the key, not deep in JupyterHub
    if args.action == "proxy":
        from portal.hub import proxyservice  # the hub's modules (JupyterHub, certificates) for this command only

        proxyservice.exec_proxy(settings)  # returns only by an exception
    if args.action == "generate-certs":
        os.chdir(Path(settings.hub.data_dir))
        os.environ[settings_module.CONFIG_ENV] = str(settings.source)
        from jupyterhub.app import main as jupyterhub_main  # only this command needs JupyterHub loaded

        return jupyterhub_main(["-f", _hub_config_file(), "--generate-certs"]) or 0
    if args.action == "move-database":
        return move_database(settings, args.to, args.password_file)
    if args.action == "install-mediator":
        print(f"installed {hubaccount.install_mediator(settings)} and {hubaccount.MEDIATOR_SETTINGS}")
        return 0
    if args.action == "sudoers":
        if not settings.hub.account:
            print("dsportal hub sudoers: set hub.account in portal.yaml (the hub's system account)", file=sys.stderr)
            return 2
        if args.install:
            print(f"installed {hubaccount.install_sudo_rule(settings.hub.account, settings.slurm.mediator)}")
        else:
            print(hubaccount.sudo_rule(settings.hub.account, settings.slurm.mediator), end="")
        return 0
    if settings.hub.account and os.geteuid() == 0:
        print(f"dsportal hub: run the hub as its account {settings.hub.account}, not as root "
              f"(runuser -u {settings.hub.account} -- dsportal hub; docs/how-to/deploy.md)", file=sys.stderr)
        return 2
    os.environ[settings_module.CONFIG_ENV] = str(settings.source)
    data_dir = Path(settings.hub.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    data_dir.chmod(0o700)  # one made before (or by hand) too: it holds the hub's secrets
    os.chdir(data_dir)
    from portal.hub import stateversion

    try:  # never an older dsportal on a state a newer one ran (its database migrated forward)
        before = stateversion.check(data_dir, version())
    except stateversion.Downgrade as refused:
        print(f"dsportal hub: {refused}", file=sys.stderr)
        return 2
    if before and before != version():
        print(f"dsportal hub: this state was last run by dsportal {before}; now {version()}", file=sys.stderr)
    gc.disable()  # while the hub loads and sets up: _start_garbage_collection
    from jupyterhub.app import main as jupyterhub_main  # only this command needs JupyterHub loaded

    from portal.upstream import hub as hub_upstream

    hub_upstream.after_init_tornado_application(_start_garbage_collection)
    # Recorded once set up on this state: a start that fails before leaves the rollback open.
    hub_upstream.after_init_tornado_application(lambda hub: stateversion.record(data_dir, version()))
    return jupyterhub_main(["-f", _hub_config_file()]) or 0


YOUNG_COLLECTION_EVERY = 50_000  # Python's default: 700


def _start_garbage_collection(hub) -> None:
    """Most objects the hub makes as it loads and sets up (modules, its database's users and spawners,
    routes) live as long as it does. With Python's cyclic garbage collector on, each full collection
    while a class starts looked over all of them again, the hub's loop stopped meanwhile. The
    collector is off until the hub is set up (after its tornado application, before it serves), then
    collects once, freezes what is left (gc.freeze: left out of every later collection) and runs again,
    over what the hub makes while it serves.

    What it makes while it serves is mostly a request's, gone by its end; with Python's default of a young
    collection every 700 new objects, those still alive at that moment (a request waiting on the database)
    were moved on, a generation at a time, to the oldest, and once a quarter of it was new, a full collection
    walked every person the hub knows, the loop stopped: every 8 s with 2,000 people clicking, 0.3 to 0.8 s
    each, finding a few hundred objects to free (bench/results/scale-2026-12-07.md, run H). A young collection
    every YOUNG_COLLECTION_EVERY new objects leaves a request's objects the time to go by themselves.

    Each collection from then on is counted, and a long one logged (portal/hub/gcwatch.py)."""
    from portal.hub import gcwatch

    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])
    gcwatch.install()
    gc.enable()
    hub.log.info("dsportal: set up; garbage collection on, the %d objects of the start left out of it, a young "
                 "collection every %d new objects", gc.get_freeze_count(), YOUNG_COLLECTION_EVERY)


def move_database(settings, target_url: str | None, password_file: Path | None) -> int:
    password_file = password_file or settings.hub.db_password_file
    if not target_url or not password_file:
        print("dsportal hub move-database: give the server database (--to URL) and its password file "
              "(--password-file, or hub.db_password_file in portal.yaml)", file=sys.stderr)
        return 2
    from portal.admin import dbmove  # JupyterHub's tables and alembic, slow to import: only this command loads them

    try:
        moved = dbmove.move_database(settings, target_url, password_file)
    except (ValueError, dbmove.DatabaseError) as error:  # ValueError: a URL dsportal does not take
        print(f"dsportal hub move-database: {error}", file=sys.stderr)
        return 1
    print(f"moved {moved.source} to {moved.target} (JupyterHub schema {moved.revision}); rows per table:")
    for table, count in moved.counts.items():
        print(f"  {table:<28} {count}")
    print(f"Now set in {settings.source}, under hub:\n  db_url: {moved.target}\n  db_password_file: "
          f"{Path(password_file).resolve()}\nand start the hub. The SQLite file stays as it was, as a backup.")
    return 0


def install_units(dest: Path | None, force: bool, units: tuple[str, ...], command: str) -> int:
    """systemd units from the installed package into /etc/systemd/system (``dest``): the login node's (the
    hub's and the proxy's) or every node's (the node firewall's); a unit there that differs (the site's edits)
    is kept unless ``force``. Exit 1 where one was kept."""
    try:
        done, kept = hubaccount.install_units(units, dest or hubaccount.SYSTEMD_UNITS, force)
    except OSError as error:
        print(f"dsportal {command}: {error}", file=sys.stderr)
        return 1
    for line in done:
        print(line)
    for line in kept:
        print(f"dsportal {command}: {line}", file=sys.stderr)
    return 1 if kept else 0


def cmd_check(args) -> int:
    ok, report = run_checks(args.config, production=True)
    print("dsportal check")
    print(report)
    print("all checks passed" if ok else "some checks FAILED")
    return 0 if ok else 1


def cmd_images(args) -> int:
    return images.main(production_settings(args), args.action, args.name, args.wheels_in, args.ready,
                       args.parent)


def cmd_templates(args) -> int:
    settings = production_settings(args)
    if args.action == "check":
        return templatecheck.check(settings, user=args.user, sources=args.source, timeout=args.timeout)
    print(f"Template sources (shown read-only as ~/{settings.templates.folder}/ in every session; "
          f"copies go to ~/{settings.templates.copies}/):")
    for source in settings.templates.sources:
        folder = Path(source.path)
        found = notebooks(folder) if folder.is_dir() else []
        state = f"{len(found)} notebook(s)" if folder.is_dir() else "MISSING"
        who = f", groups {', '.join(source.groups)}" if source.groups else ""
        print(f"  {source.name:<16} {str(folder):<48} {state}{who}")
        for notebook in found:
            print(f"      {notebook.relative_to(folder)}")
    return 0


def cmd_firewall(args) -> int:
    if args.action == "install-unit":  # every node: its unit from the installed package, no portal.yaml needed
        return install_units(args.dest, args.force, hubaccount.FIREWALL_UNITS, "firewall install-unit")
    try:
        if args.action == "up":
            firewall.up((firewall.uid_of(u) for u in args.users), args.cluster, hub_ports=args.hub_ports,
                        local_ports=args.local_ports, compute=args.compute)
        elif args.action == "add-user":
            firewall.add_users(firewall.uid_of(u) for u in args.users)
        elif args.action == "down":
            firewall.down()
        separated, hosts, guarded = firewall.users(), firewall.cluster_hosts(), firewall.guarded_ports()
    except (firewall.FirewallUnavailable, KeyError) as error:
        print(f"dsportal firewall {args.action}: {error}", file=sys.stderr)
        return 1
    if separated is None:
        print("node firewall: not in place")
    else:
        print(f"node firewall: in place; TCP on this node separates {len(separated)} portal user(s)"
              + (f" (uids {', '.join(map(str, separated))})" if separated else "")
              + "; cluster hosts: " + (", ".join(hosts) if hosts else "none (no user reaches another host's users)")
              + "; " + firewall.describe_guarded(guarded))
    return 0


def cmd_usage(args) -> int:
    settings = production_settings(args)
    try:
        since = usage.since_time(args.since) if args.days is None else usage.since_time(f"{args.days}d")
        by = tuple(part.strip() for part in args.by.split(",") if part.strip())
        if not by or any(part not in usage.KEYS for part in by):
            raise ValueError(f"--by takes some of {', '.join(usage.KEYS)} (comma-separated), not {args.by!r}")
    except ValueError as error:
        print(f"dsportal usage: {error}", file=sys.stderr)
        return 2
    slurm = SlurmCommands.from_settings(settings)
    try:
        rows = usage.collect(since, slurm, args.user)
    except usage.UsageUnavailable as error:
        backlog = slurm.accounting_backlog()
        if backlog:
            print(f"dsportal usage: Slurm accounting is behind: slurmdbd does not answer "
                  f"({(str(error) or 'no answer').splitlines()[-1]}), and slurmctld holds {backlog} record(s) for it, "
                  "which reach it "
                  "once it is back. Ask again then.", file=sys.stderr)
        else:
            print(f"dsportal usage: Slurm accounting did not answer ({error}). It needs slurmdbd "
                  "(AccountingStorageType=accounting_storage/slurmdbd); see docs/how-to/deploy.md.", file=sys.stderr)
        return 1
    backlog = slurm.accounting_backlog()
    if backlog and backlog >= CATCHING_UP:
        print(f"dsportal usage: accounting is catching up: slurmctld still holds {backlog} record(s) for slurmdbd, "
              "so the latest jobs may be missing below.", file=sys.stderr)
    print(usage.report(rows, since, by))
    return 0


def cmd_docs(args) -> int:
    sys.stdout.write(settingsdoc.render())
    return 0


class _Version(argparse.Action):
    """--version: the installed package's version (pyproject.toml's, its one source), looked up only when asked:
    every command, the Slurm Prolog's `dsportal firewall add-user` among them, starts without it."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"dsportal {version()}")
        parser.exit()


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dsportal")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="dsportal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print the installed version and exit")
    parser.add_argument("--config", help=f"portal.yaml (default: ${settings_module.CONFIG_ENV}, else "
                        f"{settings_module.PRODUCTION_CONFIG})")
    sub = parser.add_subparsers(dest="command", required=True)
    hub_parser = sub.add_parser("hub", help="run JupyterHub configured from portal.yaml; install-mediator: the "
                                "root-owned program the hub runs as users; sudoers: the hub account's one sudo rule; "
                                "install-units: the login node's systemd units (hub, proxy) from the package; "
                                "move-database: move the stopped hub's SQLite database to a database server; proxy: become the "
                                "configurable-http-proxy of hub.external_proxy; generate-certs: the internal-ssl "
                                "certificates (the proxy's among them) without starting the hub")
    hub_parser.add_argument("action", nargs="?", default="run",
                            choices=["run", "install-mediator", "sudoers", "install-units", "move-database", "proxy",
                                     "generate-certs"])
    hub_parser.add_argument("--install", action="store_true", help="sudoers: write /etc/sudoers.d/dsportal (visudo-checked)")
    hub_parser.add_argument("--to", metavar="URL", help="move-database: the server database, an SQLAlchemy URL "
                            "without a password, e.g. mysql+pymysql://dsportal_hub@127.0.0.1:3306/jupyterhub")
    hub_parser.add_argument("--password-file", type=Path, help="move-database: the file holding its password, "
                            "mode 0600 (default: hub.db_password_file)")
    hub_parser.add_argument("--dest", type=Path, help=f"install-units: this folder instead of {hubaccount.SYSTEMD_UNITS}")
    hub_parser.add_argument("--force", action="store_true", help="install-units: replace units there that differ")
    hub_parser.set_defaults(func=cmd_hub)
    sub.add_parser("check", help="verify Slurm, LDAP and the user environment").set_defaults(func=cmd_check)
    images_parser = sub.add_parser("images", help="the container image catalog")
    images_parser.add_argument("action", choices=["list", "build", "build-demo", "queue", "heartbeat"])
    images_parser.add_argument("name", nargs="?", help="image to build")
    images_parser.add_argument("--wheels-in", type=float, default=0,
                               help="queue: seconds until the wheels images need are built")
    images_parser.add_argument("--ready", action="store_true",
                               help="build-demo: only the images whose wheels are there already")
    images_parser.add_argument("--parent", type=int, help="heartbeat: the builder's pid (ends when it ends)")
    images_parser.set_defaults(func=cmd_images)
    templates_parser = sub.add_parser("templates", help="instructor template notebooks")
    templates_parser.add_argument("action", choices=["list", "check"])
    templates_parser.add_argument("--user", help="run every notebook as this account (check; default for root: "
                                  "each source's owner, else the first member of a group that may open it)")
    templates_parser.add_argument("--source", action="append", help="only this source (repeatable)")
    templates_parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    templates_parser.set_defaults(func=cmd_templates)
    firewall_parser = sub.add_parser("firewall", help="node firewall: users' TCP services only for themselves; "
                                     "install-unit: its systemd unit (dsportal-firewall.service) from the package")
    firewall_parser.add_argument("action", choices=["up", "add-user", "down", "status", "install-unit"])
    firewall_parser.add_argument("users", nargs="*", help="account names or uids (up: all portal users of the "
                                 "node; add-user: e.g. $SLURM_JOB_UID from the Slurm Prolog)")
    firewall_parser.add_argument("--cluster", action="append", default=[], metavar="ADDRESS[/BITS]",
                                 help="up: an IPv4 address or network of the cluster's hosts (login and compute "
                                 "nodes, each running this firewall); repeatable")
    firewall_parser.add_argument("--hub-ports", action="append", default=[], metavar="PORT[,PORT...]",
                                 help="up, on the login node: the hub's API and dsportal's service (8081,8082): only "
                                 "the --compute hosts and this host reach them; empty: none")
    firewall_parser.add_argument("--local-ports", action="append", default=[], metavar="PORT[,PORT...]",
                                 help="up, on the login node: the proxy's API (8001): only this host reaches it")
    firewall_parser.add_argument("--compute", action="append", default=[], metavar="ADDRESS[/BITS][,...]",
                                 help="up, with --hub-ports: the compute nodes (where sessions run), IPv4 addresses "
                                 "or networks; repeatable")
    firewall_parser.add_argument("--dest", type=Path, help="install-unit: this folder instead of "
                                 f"{hubaccount.SYSTEMD_UNITS}")
    firewall_parser.add_argument("--force", action="store_true", help="install-unit: replace a unit there that differs")
    firewall_parser.set_defaults(func=cmd_firewall)
    usage_parser = sub.add_parser("usage", help="sessions, GPU-hours and CPU-hours per user, Slurm account (course) "
                                  "and profile, from Slurm accounting (sacct)")
    usage_parser.add_argument("--since", default="30d", help="7d, 12h, 2w or a date such as 2026-11-01 (default 30d)")
    usage_parser.add_argument("--days", type=int, help="the same as --since Nd")
    usage_parser.add_argument("--by", default="user,account,profile",
                              help="rows per these, comma-separated: user, account, profile (default all three)")
    usage_parser.add_argument("--user", help="only this user's jobs")
    usage_parser.set_defaults(func=cmd_usage)
    docs_parser = sub.add_parser("docs", help="print a reference written from the code: portal-yaml, every key of "
                                 f"portal.yaml from the settings model (the file {settingsdoc.TARGET})")
    docs_parser.add_argument("what", choices=["portal-yaml"])
    docs_parser.set_defaults(func=cmd_docs)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except settings_module.SettingsError as error:
        print(f"dsportal: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
