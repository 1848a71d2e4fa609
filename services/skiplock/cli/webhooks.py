"""`skiplock webhooks add|list|remove|rotate-secret|enable` and `skiplock deliveries
list|redeliver`: the webhook endpoints and what was sent to them, newest first. Each change writes
the audit row of the API's matching route (`webhook.create`, `webhook.delete`,
`webhook.rotate_secret`, `webhook.enable`, `delivery.redeliver`, `webhook.redeliver`), the actor
being `cli:<os user>`; a refused one (not found) its row with the error's code."""

from __future__ import annotations

import datetime as dt

from ..engine.errors import DeliveryNotFound, InvalidInput
from ..engine.settings import Settings
from .command import audited, open_store, print_table


def add_parsers(sub) -> None:
    wh = sub.add_parser("webhooks", help="manage webhook endpoints")
    whs = wh.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = whs.add_parser("add", help="register an endpoint; prints its id and secret (shown once)")
    add.add_argument("url")
    add.add_argument("--events", default="task.*",
                     help="comma-separated event types, or task.* for all (default)")
    add.add_argument("--secret", help="a whsec_ secret (default: generated)")
    add.add_argument("--description")
    whs.add_parser("list", help="show endpoints, newest first")
    for action, text in (("remove", "delete an endpoint and its deliveries"),
                         ("rotate-secret", "replace an endpoint's secret; prints the new one"),
                         ("enable", "deliver to an endpoint again (after a 410 disabled it)")):
        a = whs.add_parser(action, help=text)
        a.add_argument("id")
    wh.set_defaults(run=run)

    dl = sub.add_parser("deliveries", help="inspect and redeliver webhook deliveries")
    dls = dl.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = dls.add_parser("list", help="show the latest deliveries, newest first")
    ls.add_argument("--state", choices=("pending", "delivering", "delivered", "dead"))
    ls.add_argument("--endpoint")
    ls.add_argument("--limit", type=int, default=50, help="how many, 1-1000 (default 50)")
    rd = dls.add_parser("redeliver", help="send dead deliveries again: one by id, or all of an endpoint")
    target = rd.add_mutually_exclusive_group(required=True)
    target.add_argument("id", nargs="?")
    target.add_argument("--endpoint")
    dl.set_defaults(run=run)


def run(args) -> int:
    return _webhooks(args, Settings.from_env())


def _webhooks(args, settings: Settings) -> int:
    from ..engine.webhooks import AddressGuard, check_event_types, check_secret, generate_secret

    if args.command == "webhooks" and args.action == "add":
        events = check_event_types(args.events)
        secret = check_secret(args.secret) if args.secret else generate_secret()
        AddressGuard.from_settings(settings).resolve(args.url)
    if args.command == "deliveries" and args.action == "list" and not 1 <= args.limit <= 1000:
        raise InvalidInput(f"--limit {args.limit}: must be 1-1000")
    store = open_store(settings)
    try:
        if args.command == "webhooks" and args.action == "list":
            _print_endpoints(store.webhooks.webhook_endpoint_list())
        elif args.command == "webhooks" and args.action == "add":
            with audited(store, "webhook.create") as (tx, change):
                endpoint = tx.webhooks.webhook_endpoint_insert(args.url, events, secret, args.description)
                change.target = str(endpoint.id)
                change.detail = {"url": endpoint.url, "events": events}  # never the secret
            print(f"id: {endpoint.id}")
            print(f"secret: {secret}   (shown once: store it with the receiver)")
        elif args.command == "webhooks":
            _change_endpoint(store, args.action, args.id, generate_secret)
        elif args.action == "list":
            _print_deliveries(store.webhooks.webhook_delivery_list_newest(state=args.state, endpoint_id=args.endpoint,
                                                                          limit=args.limit))
        else:
            _redeliver(store, args.id, args.endpoint)
    finally:
        store.close()
    return 0


def _change_endpoint(store, action: str, endpoint_id: str, generate_secret) -> None:
    """remove, rotate-secret or enable, audited as DELETE /v1/webhooks/{id} and its POST .../rotate-secret
    and .../enable are."""
    with audited(store, {"remove": "webhook.delete", "rotate-secret": "webhook.rotate_secret",
                         "enable": "webhook.enable"}[action], endpoint_id) as (tx, _change):
        if action == "remove":
            tx.webhooks.webhook_endpoint_delete(endpoint_id)
        elif action == "rotate-secret":
            secret = generate_secret()
            tx.webhooks.webhook_endpoint_set_secret(endpoint_id, secret)
        else:
            tx.webhooks.webhook_endpoint_set_enabled(endpoint_id, True)
    if action == "rotate-secret":
        print(f"secret: {secret}   (shown once)")
    else:
        print(f"{'removed' if action == 'remove' else 'enabled'}: {endpoint_id}")


def _redeliver(store, delivery_id: str | None, endpoint_id: str | None) -> None:
    """One dead delivery (audited delivery.redeliver) or an endpoint's (webhook.redeliver)."""
    with audited(store, "delivery.redeliver" if delivery_id else "webhook.redeliver",
                 delivery_id or endpoint_id) as (tx, change):
        n = tx.webhooks.webhook_delivery_redeliver(delivery_id=delivery_id, endpoint_id=endpoint_id)
        if delivery_id and not n:  # raising rolls back; the refusal's row is written
            raise DeliveryNotFound(f"no dead delivery {delivery_id}")
        change.detail = None if delivery_id else {"redelivered": n}
    print(f"{n} deliver{'y' if n == 1 else 'ies'} queued again")


def _print_endpoints(endpoints) -> None:
    """Newest first, as `tasks list` (GET /v1/webhooks answers oldest first: its JSON is unchanged)."""
    endpoints = sorted(endpoints, key=lambda e: (e.created_at, str(e.id)), reverse=True)
    print_table(("ID", "URL", "EVENTS", "STATE", "PENDING", "DEAD", "CREATED (UTC)"),
                [(str(e.id), e.url, ",".join(e.event_types),
                  "enabled" if e.enabled else f"disabled ({e.disabled_reason})", str(e.pending), str(e.dead),
                  _utc(e.created_at)) for e in endpoints], "no webhook endpoints")


def _print_deliveries(deliveries) -> None:
    print_table(("ID", "ENDPOINT", "EVENT", "STATE", "ATTEMPTS", "LAST STATUS", "CREATED (UTC)", "LAST ERROR"),
                [(str(d.id), str(d.endpoint_id), d.event_type, d.state, str(d.attempts),
                  "-" if d.last_status is None else str(d.last_status), _utc(d.created_at),
                  " ".join((d.last_error or "-").split())[:60]) for d in deliveries], "no deliveries")


def _utc(at) -> str:
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
