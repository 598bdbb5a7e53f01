"""Stop strings over a stream of UTF-8 byte pieces: the text before a stop string, never the stop string itself."""

from __future__ import annotations

import codecs


class StopScanner:
    """Turns a stream of UTF-8 byte pieces into text, holding back what could start a stop string.

    `feed` returns the text that is safe to send now; once a stop string appears, `stopped` is
    set and nothing from the stop string on is ever returned. The held-back tail is at most
    (longest stop string - 1) characters, so a stop string split across pieces is still found.
    """

    def __init__(self, stops: list[str] | None = None):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = [s for s in (stops or []) if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        text = self.pending + self.decoder.decode(piece)
        if not self.stops:
            self.pending = ""
            return text
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self.pending = ""
            return text[:cut]
        keep = len(text) - self.hold if self.hold else len(text)
        keep = max(keep, 0)
        self.pending = text[keep:]
        return text[:keep]

    def flush(self) -> str:
        """The held-back text at the end of generation (no stop string completed)."""
        if self.stopped:
            return ""
        text = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return text[:cut]
        return text

    def _first_stop(self, text: str) -> int | None:
        """Where to cut: at the stop string that completes first (then starts first), as a token-by-token
        scan would find it, so the text does not depend on how tokens were grouped into pieces."""
        best = None
        for stop in self.stops:
            i = text.find(stop)
            if i >= 0 and (best is None or (i + len(stop), i) < best):
                best = (i + len(stop), i)
        return best[1] if best else None
