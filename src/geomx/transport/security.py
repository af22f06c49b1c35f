"""Who may connect: a shared secret (ZeroMQ PLAIN) or CURVE keys, checked by a ZAP handler in the van.

Why ZeroMQ's own handshake and not an HMAC over every frame: ZeroMQ asks a ZAP handler about every new
connection *before* it delivers a single frame from it, so a peer without the secret is refused during the
handshake and its bytes never reach ``wire.decode`` (nor the byte counters). Checking once per connection
also costs nothing per tensor, where an HMAC would hash every gradient byte twice (sender and receiver).

Two mechanisms, both checked by ``Guard.answer`` (the ZAP handler, run by the van's I/O thread):

* **PLAIN** (``security.secret`` / GEOMX_SECRET): every client presents the shared secret as its password,
  compared in constant time. PLAIN sends it in clear text: fine inside a data center, not over the open
  internet — use CURVE there.
* **CURVE** (``security.curve_keys``: a folder made by ``geomx keygen``): one key pair per party; every link
  is encrypted (Curve25519 + XSalsa20-Poly1305) and a client is admitted only if its public key is one of
  the folder's. A party needs every party's public key and its own secret key.

Usage::

    guard = Guard(topology.security, party="dc1")          # raises SecurityError on a bad key folder
    zap = guard.serve(context, router)                     # before router.bind(); poll zap, call answer()
    guard.connect(dealer, peer_party="dc0")                # before dealer.connect()
    generate_keys(Path("keys"), ["dc0", "dc1"])            # what `geomx keygen` does
    check_keys(topology, ["dc1"])                          # SecurityError naming a missing or bad key file
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
import zmq.utils.z85

from ..config import SecuritySpec, Topology

log = logging.getLogger("geomx.transport.security")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
ZAP_DOMAIN = b"geomx"
PLAIN_USER = b"geomx"


_PROTOCOL_ERRORS = {
    getattr(zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000003): "security mechanism mismatch",
}


class SecurityError(ValueError):
    """A key folder or secret that cannot secure a job (names the file or the problem)."""


def generate_keys(folder: Path, parties: list[str]) -> list[Path]:
    """Write a CURVE key pair per party (``<party>.key`` public, ``<party>.key_secret`` secret); returns them.

    Refuses to overwrite existing keys: a new pair would lock out every host still holding the old one.
    """
    if not parties:
        raise SecurityError("name at least one party to make keys for")
    folder.mkdir(parents=True, exist_ok=True)
    existing = [folder / f"{p}.key" for p in parties if (folder / f"{p}.key").exists()]
    if existing:
        raise SecurityError(f"keys already exist: {[str(p) for p in existing]}; remove them first")
    written: list[Path] = []
    for party in parties:
        public, secret = zmq.auth.create_certificates(str(folder), party)
        Path(secret).chmod(0o600)
        written += [Path(public), Path(secret)]
    return written


def _read_key(path: Path, party: str, what: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None), Z85, of one key file; SecurityError naming the file and its party if it cannot
    secure a link (a wrong key would otherwise fail later, inside ZeroMQ, with no file named)."""
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read party {party!r}'s {what} {path}: {exc}") from None
    for key in (public, secret):
        try:
            ok = key is None or len(zmq.utils.z85.decode(key)) == 32
        except (ValueError, KeyError):  # (a character outside Z85's alphabet is a KeyError)
            ok = False
        if not ok:
            raise SecurityError(f"party {party!r}'s {what} {path} is malformed: not a 40-character Z85 key "
                                "(make the keys again with `geomx keygen`)")
    return public, secret


def _load_keys(folder: Path, party: str, needed: Iterable[str] = ()) -> tuple[dict[str, bytes], bytes, bytes]:
    """(party -> public key, own public key, own secret key), all Z85, from a ``geomx keygen`` folder; the public
    keys of the parties ``needed`` must be there. The one place key files are read (``Guard``, ``check_keys``)."""
    if not folder.is_dir():
        raise SecurityError(f"CURVE key folder {folder} does not exist; make it with `geomx keygen`")
    publics: dict[str, bytes] = {}
    for path in sorted(folder.glob("*.key")):
        publics[path.stem], _ = _read_key(path, path.stem, "public key")
    for name in needed:
        if name not in publics:
            raise SecurityError(f"party {name!r} has no public key {folder / f'{name}.key'}; every host needs every "
                                "party's .key file (from `geomx keygen`)")
    own = folder / f"{party}.key_secret"
    if not own.exists():
        raise SecurityError(f"party {party!r} has no secret key {own}; this host needs it (from `geomx keygen`)")
    public, secret = _read_key(own, party, "secret key")
    if secret is None:
        raise SecurityError(f"party {party!r}'s secret key file {own} holds no secret key")
    return publics, public, secret


def check_keys(topology: Topology, parties: Iterable[str]) -> None:
    """SecurityError naming the first key file that the processes of ``parties`` need and cannot read (each its
    party's secret key, every party's public key); nothing without CURVE. ``geomx launch`` calls it before it
    starts any process: a missing key is one line, not a traceback per process. (A node started by hand meets the
    same errors from its ``Guard``, given its job's parties as ``peers``, which ``geomx.node`` prints as one line.)
    """
    folder = topology.security.curve_keys
    if folder is None:
        return
    if not zmq.has("curve"):
        raise SecurityError("this libzmq was built without CURVE support")
    for party in sorted(set(parties)):
        _load_keys(folder, party, [p.name for p in topology.parties])


class Guard:
    """One node's security settings: configures its sockets and answers its ZAP requests."""

    def __init__(self, spec: SecuritySpec, party: str, name: str = "", peers: Iterable[str] = ()) -> None:
        self.spec = spec
        self.name = name or party
        self.refused = 0  # connections refused so far
        self._logged: dict[str, int] = {}
        self._publics: dict[str, bytes] = {}
        self._allowed_keys: set[bytes] = set()
        self._public = self._secret = b""
        if spec.curve_keys is not None:
            if not zmq.has("curve"):
                raise SecurityError("this libzmq was built without CURVE support")
            self._publics, self._public, self._secret = _load_keys(spec.curve_keys, party, peers)
            self._allowed_keys = {zmq.utils.z85.decode(k) for k in self._publics.values()}
        self._password = spec.secret.encode() if spec.secret is not None else b""
        self._zap: zmq.Socket[Any] | None = None

    @property
    def mechanism(self) -> str:
        return "curve" if self.spec.curve_keys is not None else "plain" if self.spec.secret is not None else "none"

    def serve(self, context: zmq.Context[Any], router: zmq.Socket[Any]) -> list[zmq.Socket[Any]]:
        """Make ``router`` demand credentials; returns the sockets to poll and pass to ``answer`` (the ZAP
        handler, and a monitor that reports handshakes failing before ZAP, e.g. a peer with no credentials)."""
        if not self.spec.enabled:
            return []
        zap = context.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)
        router.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        if self.mechanism == "curve":
            router.setsockopt(zmq.CURVE_SERVER, 1)
            router.setsockopt(zmq.CURVE_PUBLICKEY, self._public)
            router.setsockopt(zmq.CURVE_SECRETKEY, self._secret)
        else:
            router.setsockopt(zmq.PLAIN_SERVER, 1)
        monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        monitor.setsockopt(zmq.LINGER, 0)
        self._zap = zap
        return [zap, monitor]

    def connect(self, dealer: zmq.Socket[Any], peer_party: str) -> None:
        """Give ``dealer`` the credentials for a peer of ``peer_party`` (before it connects)."""
        if self.mechanism == "curve":
            server_key = self._publics.get(peer_party)
            if server_key is None:
                raise SecurityError(f"no public key for party {peer_party!r} in {self.spec.curve_keys}")
            dealer.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            dealer.setsockopt(zmq.CURVE_PUBLICKEY, self._public)
            dealer.setsockopt(zmq.CURVE_SECRETKEY, self._secret)
        elif self.mechanism == "plain":
            dealer.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USER)
            dealer.setsockopt(zmq.PLAIN_PASSWORD, self._password)

    def check(self, mechanism: bytes, credentials: list[bytes]) -> str | None:
        """None if these credentials may connect, else why not."""
        if self.mechanism == "curve":
            if mechanism != b"CURVE" or len(credentials) != 1:
                return f"expected CURVE, got {mechanism.decode(errors='replace')}"
            return None if credentials[0] in self._allowed_keys else "its public key is not one of the job's"
        if mechanism != b"PLAIN" or len(credentials) != 2:
            return f"expected PLAIN, got {mechanism.decode(errors='replace')}"
        user, password = credentials
        ok = hmac.compare_digest(password, self._password) and hmac.compare_digest(user, PLAIN_USER)
        return None if ok else "wrong shared secret"

    def answer(self, sock: zmq.Socket[Any]) -> None:
        """Handle what is pending on one of ``serve``'s sockets (called by the I/O thread when it is readable)."""
        if sock is not self._zap:
            self._monitor_events(sock)
            return
        while True:
            try:
                request = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(request) < 6:  # libzmq always sends at least 6 frames; answer so the handshake fails
                sock.send_multipart([ZAP_VERSION, request[1] if len(request) > 1 else b"", b"400",
                                     b"malformed ZAP request", b"", b""])
                continue
            version, request_id, _domain, address, _identity, mechanism = request[:6]
            problem = "unsupported ZAP version" if version != ZAP_VERSION else self.check(mechanism, request[6:])
            if problem is None:
                sock.send_multipart([ZAP_VERSION, request_id, b"200", b"OK", b"peer", b""])
                continue
            self.refused += 1
            self._log_refusal(address.decode(errors="replace"), problem)
            sock.send_multipart([ZAP_VERSION, request_id, b"400", problem.encode(), b"", b""])

    def _monitor_events(self, monitor: zmq.Socket[Any]) -> None:
        """A handshake that failed before ZAP: wrong mechanism (no credentials, PLAIN against CURVE ...)."""
        # imported here: zmq.utils.monitor imports asyncio (~0.05 CPU-s), which every scheduler and server would pay
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.refused += 1
            self._log_refusal("a peer", f"handshake failed ({_PROTOCOL_ERRORS.get(event['value'], event['value'])})"
                              f"; it does not speak this job's {self.mechanism.upper()} security")

    def _log_refusal(self, address: str, problem: str) -> None:
        """One line for the first refusal of an address, then one per 100 (a stranger retries forever)."""
        count = self._logged.get(address, 0) + 1
        self._logged[address] = count
        if count == 1 or count % 100 == 0:
            log.warning("[%s] refused a connection from %s: %s (%d refused from there so far)", self.name,
                        address or "?", problem, count)
