"""`skiplock webhooks add|list|remove|rotate-secret|enable` and `skiplock deliveries
list|redeliver`: the webhook endpoints and what was sent to them."""

from __future__ import annotations

from ..engine.errors import DeliveryNotFound, InvalidInput
from ..engine.settings import Settings
from .command import open_store


def add_parsers(sub) -> None:
    wh = sub.add_parser("webhooks", help="manage webhook endpoints")
    whs = wh.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = whs.add_parser("add", help="register an endpoint; prints its id and secret (shown once)")
    add.add_argument("url")
    add.add_argument("--events", default="task.*",
                     help="comma-separated event types, or task.* for all (default)")
    add.add_argument("--secret", help="a whsec_ secret (default: generated)")
    add.add_argument("--description")
    whs.add_parser("list", help="show endpoints")
    for action, text in (("remove", "delete an endpoint and its deliveries"),
                         ("rotate-secret", "replace an endpoint's secret; prints the new one"),
                         ("enable", "deliver to an endpoint again (after a 410 disabled it)")):
        a = whs.add_parser(action, help=text)
        a.add_argument("id")
    wh.set_defaults(run=run)

    dl = sub.add_parser("deliveries", help="inspect and redeliver webhook deliveries")
    dls = dl.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = dls.add_parser("list", help="show deliveries")
    ls.add_argument("--state", choices=("pending", "delivering", "delivered", "dead"))
    ls.add_argument("--endpoint")
    ls.add_argument("--limit", type=int, default=50)
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
        if args.command == "webhooks":
            if args.action == "add":
                endpoint = store.webhooks.webhook_endpoint_insert(args.url, events, secret, args.description)
                print(f"id: {endpoint.id}")
                print(f"secret: {secret}   (shown once: store it with the receiver)")
            elif args.action == "list":
                endpoints = store.webhooks.webhook_endpoint_list()
                if not endpoints:
                    print("no webhook endpoints")
                for e in endpoints:
                    state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
                    print(f"{e.id}  {e.url}  events={','.join(e.event_types)}  {state}  "
                          f"pending={e.pending} dead={e.dead}")
            elif args.action == "remove":
                store.webhooks.webhook_endpoint_delete(args.id)
                print(f"removed: {args.id}")
            elif args.action == "rotate-secret":
                secret = generate_secret()
                store.webhooks.webhook_endpoint_set_secret(args.id, secret)
                print(f"secret: {secret}   (shown once)")
            else:
                store.webhooks.webhook_endpoint_set_enabled(args.id, True)
                print(f"enabled: {args.id}")
        elif args.action == "list":
            for d in store.webhooks.webhook_delivery_list(state=args.state, endpoint_id=args.endpoint,
                                                          limit=args.limit):
                print(f"{d.id}  {d.event_type}  {d.state}  attempts={d.attempts}  "
                      f"last_status={d.last_status}  {d.last_error or ''}".rstrip())
        else:
            n = store.webhooks.webhook_delivery_redeliver(delivery_id=args.id, endpoint_id=args.endpoint)
            if args.id and not n:
                raise DeliveryNotFound(f"no dead delivery {args.id}")
            print(f"{n} deliver{'y' if n == 1 else 'ies'} queued again")
    finally:
        store.close()
    return 0
