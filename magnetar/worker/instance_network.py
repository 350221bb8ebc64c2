"""What isolated instances may reach on the network, held by the kernel (nftables).

An instance's code may open any socket, whatever its language's own checks say (a Python
function calls ``socket.connect`` itself). On a worker's machine that reaches what trusts
the machine: the worker's REST API and everything else listening on it, and the cloud's
metadata service (``169.254.169.254``), which hands the machine's credentials to whoever
asks. A listening socket lets it wait for a restarting worker's port and read what clients
send there (their tokens).

So where the worker runs as root with instance isolation, every uid of ``instance_uids``
is held by a table of rules (``inet magnetar_instances``) on every packet it sends:

* no connection is accepted: an instance's listening socket never answers a handshake;
* to this machine's own addresses (loopback included), only the broker's ports, DNS (port
  53: a resolver stub listens there on many hosts) and ``instance_host_ports``;
* nothing to link-local addresses (cloud metadata services: ``169.254.0.0/16``,
  ``fe80::/10``, and EC2's ``fd00:ec2::254``);
* anything else (other machines: the broker, databases, APIs) as before.

Refused connections fail at once (``EHOSTUNREACH``/``EACCES``), not after a timeout. The
table is the host's, shared by its workers: each adds its uids and ports to its sets and
writes the same rules, in one transaction (``nft -f``), and it stays when they stop
(``nft delete table inet magnetar_instances`` removes it). Rules match by uid, so they hold
for whatever the instance starts, and cost the worker's own traffic one set lookup.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "TABLE",
    "InstanceNetwork",
    "broker_ports",
    "limit_instance_network",
    "remove_table",
    "table_exists",
]

log = logging.getLogger(__name__)

TABLE = "magnetar_instances"
_DNS = 53


def broker_ports(broker_url: str) -> set[int]:
    """The ports of a service URL (``pulsar://a:6650,b:6650``, ``pulsar+ssl://a``)."""
    scheme, _, hosts = broker_url.partition("://")
    default = 6651 if scheme.endswith("ssl") else 6650
    ports = set()
    for host in hosts.split("/", 1)[0].split(","):
        port = urlsplit(f"//{host}").port
        ports.add(port or default)
    return ports


@dataclass(frozen=True)
class InstanceNetwork:
    """The rules for the instances of ``uids``, who may reach ``host_ports`` here."""

    uids: range
    host_ports: frozenset[int]
    table: str = TABLE

    def ruleset(self) -> str:
        """The ``nft -f`` input: the table made if missing, its rules written again, and
        this worker's uids and ports added to what other workers added."""
        t = f"inet {self.table}"
        ports = ", ".join(str(p) for p in sorted(self.host_ports | {_DNS}))
        # counted: ``nft list table inet magnetar_instances`` shows what instances were refused
        reject = "counter reject with icmpx type admin-prohibited"
        return "\n".join(
            [
                f"add table {t}",
                f"add set {t} uids {{ type uid; flags interval; auto-merge; }}",
                f"add set {t} host_ports {{ type inet_service; }}",
                f"add chain {t} output {{ type filter hook output priority filter; }}",
                f"add chain {t} instance",
                f"flush chain {t} output",
                f"flush chain {t} instance",
                f"add rule {t} output meta skuid @uids jump instance",
                # a listening socket's answer to a handshake
                f"add rule {t} instance tcp flags & (syn | ack) == syn | ack counter drop",
                f"add rule {t} instance fib daddr type local meta l4proto {{ tcp, udp }} "
                f"th dport @host_ports accept",
                f"add rule {t} instance fib daddr type local {reject}",
                f"add rule {t} instance ip daddr 169.254.0.0/16 {reject}",
                f"add rule {t} instance ip6 daddr {{ fe80::/10, fd00:ec2::254 }} {reject}",
                f"add element {t} uids {{ {self.uids.start}-{self.uids.stop - 1} }}",
                f"add element {t} host_ports {{ {ports} }}",
                "",
            ]
        )

    def apply(self) -> str | None:
        """Write the rules; None, else why they could not be."""
        nft = _nft()
        if nft is None:
            return "nft is not installed (Debian's nftables package)"
        try:
            done = subprocess.run(
                [nft, "-f", "-"],
                input=self.ruleset(),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"nft failed: {error}"
        if done.returncode != 0:
            return f"nft refused the rules: {done.stderr.strip()}"
        return None


def table_exists(table: str = TABLE) -> bool:
    nft = _nft()
    if nft is None:
        return False
    listed = subprocess.run([nft, "list", "table", "inet", table], capture_output=True, check=False)
    return listed.returncode == 0


def remove_table(table: str = TABLE) -> None:
    """Drop the table, rules and sets (tests: a run removes what it made)."""
    nft = _nft()
    if nft is not None:
        subprocess.run([nft, "delete", "table", "inet", table], capture_output=True, check=False)


def _nft() -> str | None:
    return shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")


def limit_instance_network(uids: range, broker_url: str, host_ports: tuple[int, ...]) -> None:
    """Write the rules for ``uids``, or warn why they cannot be."""
    network = InstanceNetwork(uids, frozenset(broker_ports(broker_url)) | frozenset(host_ports))
    why = network.apply()
    if why is not None:
        log.warning(
            "instances may reach this host's own services and the cloud's metadata service, "
            "and accept connections: %s",
            why,
        )
        return
    log.info(
        "instances reach this host on ports %s only, and no link-local address",
        ", ".join(str(p) for p in sorted(network.host_ports | {_DNS})),
    )
