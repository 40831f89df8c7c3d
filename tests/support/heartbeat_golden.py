"""Reads tests/data/heartbeat_golden.tsv, the one table of heartbeat datagrams (docs/heartbeat.md)
that the Python package's writer, libddp's writer and the agent's parser are all tested against
(tests/integration/test_heartbeat_grammar.py; tests/unit/heartbeat_grammar_test.cc reads the
same file)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(os.path.dirname(HERE), "data", "heartbeat_golden.tsv")

MAX_SECTION = 64
MAX_STEP_SECONDS = 86400.0


def unescape(text):
    """The table's escapes: \\n, \\r, \\t, \\\\, \\xNN."""
    out, i = bytearray(), 0
    raw = text.encode()
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):
            n = raw[i + 1]
            if n == ord("n"):
                out.append(10)
            elif n == ord("r"):
                out.append(13)
            elif n == ord("t"):
                out.append(9)
            elif n == ord("x"):
                out.append(int(raw[i + 2:i + 4], 16))
                i += 2
            else:
                out.append(n)
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


class Row:
    """datagram | verdict (ok / rejected) | rank | step | section | time | writer input: `-` (the
    writers never produce it) or `section=RAW;seconds=RAW` as the API was called (`write` for
    exactly the parsed values)."""

    def __init__(self, line, fields):
        self.line = line
        self.datagram_bytes = unescape(fields[0])
        self.datagram = self.datagram_bytes.decode("latin-1")
        self.accepted = fields[1] == "ok"
        self.rank = int(fields[2]) if self.accepted else None
        self.step = int(fields[3]) if self.accepted else None
        self.section = None if fields[4] == "-" else unescape(fields[4]).decode("latin-1")
        self.time = None if fields[5] == "-" else float(fields[5])
        writer = fields[6]
        self.written = writer != "-"
        self.input_section = self.section
        self._seconds_raw = self.time
        if writer not in ("-", "write"):
            for part in writer.split(";"):
                key, _, value = part.partition("=")
                if key == "section":
                    self.input_section = unescape(value).decode("utf-8")
                elif key == "seconds":
                    self._seconds_raw = value

    def input_section_clean(self):
        from ddprun import _heartbeat
        return None if self.input_section is None else _heartbeat._clean_section(self.input_section)

    def input_seconds_raw(self):
        """The seconds as the API is called with them (a number, or text a caller passed)."""
        v = self._seconds_raw
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                return v
        return v

    def input_seconds(self):
        from ddprun import _heartbeat
        return _heartbeat._clean_seconds(self.input_seconds_raw())


def rows():
    out = []
    with open(TABLE, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 7:
                raise ValueError("%s:%d: %d fields, not 7" % (TABLE, n, len(fields)))
            out.append(Row("%d: %s" % (n, line), fields))
    return out
