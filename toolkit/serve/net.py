"""Ports and health URLs: the helpers servers, perf scripts and tests share."""

from __future__ import annotations

import errno
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from toolkit.errors import ServerError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process may still take it before it is bound)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_port_free(host: str, port: int, flag: str) -> None:
    """ServerError naming the flag that chose `port` when something already listens on it (IPv4 or IPv6,
    as `host` resolves), or when `host` is no address of this machine."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ServerError(
            f"{host} (the address for {flag}) is not an address or a name this machine resolves "
            f"({exc.strerror})",
            hint="pass --host (or --metrics-host) an address of this machine (127.0.0.1, ::1, 0.0.0.0, "
            "::) or a resolvable name",
        ) from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServerError(
                    f"port {port} on {host} ({flag}) is in use",
                    hint=f"pass a free port with {flag}",
                ) from exc
            raise ServerError(
                f"cannot listen on {host} port {port} ({flag}): {exc.strerror}",
                hint="pass an address of this machine with --host, and a port you may bind",
            ) from exc


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class NotHealthy(ServerError):
    """What wait_http_ok raises itself: the process exited, or the time ran out."""


def wait_http_ok(
    url: str,
    timeout_s: float,
    process: subprocess.Popen | None = None,
    what: str = "the server",
    *,
    watch: Callable[[], None] | None = None,
) -> None:
    """Poll `url` until it answers 200; NotHealthy when `process` exits first or time runs out.
    `watch` runs between polls while `url` does not answer yet and ends the wait by raising (a stop
    signal received, another process of the caller's that died); once `url` answers, it is not run."""
    deadline = time.monotonic() + timeout_s
    while not http_ok(url):
        if watch is not None:
            watch()
        if process is not None and process.poll() is not None:
            raise NotHealthy(
                f"{what} exited with code {process.returncode} before {url} answered",
                hint="read its log",
            )
        if time.monotonic() > deadline:
            raise NotHealthy(
                f"{what} did not answer {url} within {timeout_s:.0f}s", hint="read its log"
            )
        time.sleep(0.2)


def client_host(host: str) -> str:
    """The address a local client uses for a server bound to `host`, as it goes into a URL (IPv6 in brackets)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def triton_address(host: str, flag: str) -> str:
    """The address tritonserver is given for `host`: tritonserver 2.51 listens on IPv4 only (its gRPC
    server cannot even parse an IPv6 address), so the IPv6 wildcard and loopback become their IPv4
    equivalents, and any other IPv6 address is refused naming `flag`."""
    if host == "::":
        return "0.0.0.0"
    if host == "::1":
        return "127.0.0.1"
    if ":" in host:
        raise ServerError(
            f"{flag} {host}: tritonserver listens on IPv4 addresses only",
            hint="give Triton an IPv4 address (0.0.0.0 for every interface); with --openai-port, --host may "
            "be an IPv6 address for the OpenAI API alone when --metrics-host is IPv4",
        )
    return host


def is_loopback(host: str) -> bool:
    return host in LOOPBACK
