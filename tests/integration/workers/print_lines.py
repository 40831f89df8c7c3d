"""Worker that prints COUNT long lines to stdout, each unique and checkable.

Usage: print_lines.py COUNT WIDTH
Line i of local rank r is line_text(r, i, WIDTH) (tests/integration/test_logs.py builds the same
text). Lines are written with os.write in varied ways: whole, split into several partial writes
(some with a short pause between the pieces), and several lines in one write.
"""
import hashlib
import os
import sys
import time


def line_text(rank, i, width):
    head = "L%d:%05d:" % (rank, i)
    digest = hashlib.sha256(("%d/%d" % (rank, i)).encode()).hexdigest()
    body = (digest * (width // len(digest) + 1))[: max(0, width - len(head))]
    return head + body


def write_all(fd, data):
    while data:
        n = os.write(fd, data)
        data = data[n:]


def main():
    count, width = int(sys.argv[1]), int(sys.argv[2])
    rank = int(os.environ["LOCAL_RANK"])
    i = 0
    while i < count:
        mode = i % 5
        if mode == 0 or mode == 1:
            # Several partial writes for one line; every 50th line pauses between the pieces.
            data = (line_text(rank, i, width) + "\n").encode()
            cuts = [0, len(data) // 3, (2 * len(data)) // 3, len(data) - 1, len(data)]
            for a, b in zip(cuts, cuts[1:]):
                write_all(1, data[a:b])
                if i % 50 == 0:
                    time.sleep(0.002)
            i += 1
        elif mode == 2:
            write_all(1, (line_text(rank, i, width) + "\n").encode())
            i += 1
        else:
            # Two whole lines in a single write.
            batch = []
            for j in range(i, min(i + 2, count)):
                batch.append(line_text(rank, j, width) + "\n")
            write_all(1, "".join(batch).encode())
            i += len(batch)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
