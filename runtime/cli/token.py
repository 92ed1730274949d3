"""``vnpu token create`` / ``vnpu token revoke``: tenant credentials of the running cluster.

``create --tenant NAME [--ttl 24h]`` prints a credential minted from the cluster token (the devices verify
it without a database; :mod:`driver.credentials`).  A tenant's clients present it as ``VNPU_TENANT_TOKEN``
(or ``VNPU_TOKEN``).  ``revoke TOKEN... | --tenant NAME...`` records the revocation in the cluster's state
(``revoked.json``, which devices load when they start) and pushes it to every running device (DMS
``Revoke``, with the cluster token): calls with a revoked credential are refused from then on and its open
watches end, so the leases of its clients run out and what they held is released.  Both need the cluster
token (``$VNPU_TOKEN`` or the state directory's ``token``).
"""
from __future__ import annotations

import re
import sys
import time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _ttl(text: str) -> float:
    from devices.errors import InvalidParamError
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])?\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise InvalidParamError(f"--ttl must be a positive duration such as 90s, 30m, 12h or 7d, not {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def register(sub) -> None:
    t = sub.add_parser("token", help="tenant credentials: create and revoke",
                       example=("vnpu token create --tenant team-a --ttl 12h", "vnpu token revoke --tenant team-a"))
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    c = tsub.add_parser("create", help="print a credential of tenant NAME",
                        example="VNPU_TENANT_TOKEN=$(vnpu token create --tenant team-a --ttl 12h) vnpu run generate --prompt hi")
    c.add_argument("--tenant", required=True, metavar="NAME", help="the tenant the credential authenticates")
    c.add_argument("--ttl", default="24h", help="lifetime (e.g. 30m, 12h, 7d; at most 366d)")
    c.set_defaults(fn=_cmd_create)
    r = tsub.add_parser("revoke", help="revoke credentials, or every credential of a tenant issued so far",
                        example=("vnpu token revoke --tenant team-a", "vnpu token revoke \"$TOKEN\""))
    r.add_argument("tokens", nargs="*", metavar="TOKEN", help="credentials to revoke (as vnpu token create printed them)")
    r.add_argument("--tenant", action="append", default=[], help="revoke every credential of this tenant so far")
    r.set_defaults(fn=_cmd_revoke)


def _cmd_create(a) -> int:
    from driver.credentials import check_tenant, mint
    from runtime.cluster.discovery import admin_token
    tenant, ttl = check_tenant(a.tenant), _ttl(a.ttl)
    print(mint(admin_token(), tenant, ttl))
    return 0


def _cmd_revoke(a) -> int:
    from devices.errors import InvalidParamError
    from driver.credentials import Revocations, check_tenant
    from runtime.cluster.discovery import admin_token, push, revocations_file, running_devices, state_dir
    if not a.tokens and not a.tenant:
        raise InvalidParamError("name the credentials to revoke, or --tenant NAME")
    tenants = [check_tenant(t) for t in a.tenant]
    secret = admin_token()
    now = time.time()
    update = Revocations().revoke_tokens(a.tokens, secret).revoke_tenants(tenants, now)
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    path = revocations_file()
    Revocations.load(path).merge(update.tokens, update.tenants).save(path)
    where = running_devices()
    pushed = {t: update.tenants[t] for t in tenants}
    failed = push(where, secret, "vnpu-token-revoke", lambda d: d.revoke(tokens=a.tokens, tenants=pushed))
    for w, e in failed:
        print(f"vnpu: npu{w['device_id']} at {w['address']}: not reached ({e.detail}); it loads the list "
              f"when it restarts", file=sys.stderr)
    print(f"revoked {len(a.tokens)} credential(s) and {len(tenants)} tenant(s); recorded in {path}; "
          f"pushed to {len(where) - len(failed)} of {len(where)} device(s)")
    return 1 if failed else 0

