"""The triton container's exec probe: Triton's HTTP health endpoint, which listens on the pod's
loopback only (it checks no API key), where the kubelet's httpGet probes cannot reach it.

    python3 -m toolkit.deploy.probe http://127.0.0.1:8000/v2/health/ready

Exit 0 when the URL answers 200; exit 1, with the status or the error on stderr (the kubelet puts
it into the probe's event), otherwise. Kept off the toolkit CLI on purpose: the kubelet runs it every
few seconds, and this imports only the standard library (about 0.1 s) where `toolkit` loads every
command (about a second).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = (
    3.0  # below the probes' timeoutSeconds, so the probe reports why instead of being killed
)


def probe(url: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when `url` answers 200, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        return f"GET {url}: {getattr(exc, 'reason', exc)}"
    return None if status == 200 else f"GET {url}: HTTP {status}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].startswith("http://"):
        print("usage: python3 -m toolkit.deploy.probe http://127.0.0.1:PORT/PATH", file=sys.stderr)
        return 2
    failure = probe(args[0])
    if failure is not None:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
