"""Test certificates for the TLS/mTLS tests of the rendezvous daemon, the agents and the workers'
store: make_pki(directory) writes two unrelated CAs and the server and client certificates those
tests need (good, rotated, expired, wrong name, untrusted CA, intruder) as PEM files, made with the
`openssl` command-line tool (OpenSSL 3.0), ECDSA P-256 keys, unencrypted. Nothing is cached: each
call makes a fresh set in its own directory.

Run as a script, it checks itself: `openssl verify` on each certificate and a real mTLS handshake
between `openssl s_server` and `openssl s_client`."""

import datetime
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Test network namespaces use 192.0.2.1 .. 192.0.2.8 (see netns_lib.py).
SERVER_SAN = ", ".join(["IP:127.0.0.1", "IP:::1", "DNS:localhost"] + ["IP:192.0.2.%d" % i for i in range(1, 9)])

CAS = [  # name, CN
    ("ca", "ddprun test CA"),
    ("other_ca", "unrelated CA"),
]

LEAVES = [  # name, CN, issuer, extension section, expired
    ("server", "ddprun-rdzv", "ca", "ext_server", False),
    ("server_new", "ddprun-rdzv rotated", "ca", "ext_server", False),
    ("server_other_ca", "ddprun-rdzv", "other_ca", "ext_server", False),
    ("server_expired", "ddprun-rdzv", "ca", "ext_server", True),
    ("server_wrong_name", "ddprun-rdzv", "ca", "ext_wrong_name", False),
    ("client_a", "node-a", "ca", "ext_client_a", False),
    ("client_b", "node-b", "ca", "ext_client_b", False),
    ("client_intruder", "intruder", "ca", "ext_client_intruder", False),
    ("client_other_ca", "node-c", "other_ca", "ext_client_other_ca", False),
]

EXTENSIONS = """
[ext_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always

# Agents can also host the rendezvous, so server certificates are client certificates too.
[ext_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = {server_san}

[ext_wrong_name]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:elsewhere.example
"""

CLIENT_SANS = {
    "client_a": "DNS:node-a.job1.example",
    "client_b": "DNS:node-b.job1.example",
    "client_intruder": "DNS:intruder.elsewhere.example",
    "client_other_ca": "DNS:node-c.job1.example",
}

CLIENT_EXT = """
[ext_{name}]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
extendedKeyUsage = clientAuth
subjectAltName = {san}
"""

# `openssl ca` needs a database per signing; one each lets all signings run in parallel. 3.0 wants a
# serial file named even with -rand_serial, though it never reads it then.
CA_SECTION = """
[ca_{name}]
database = {work}/{name}.index
serial = {work}/{name}.serial
new_certs_dir = {work}
policy = policy_cn
"""

EXPIRED_DATES = ("20200101000000Z", "20200102000000Z")


def _run_all(cmds):
    """Runs the openssl commands in parallel (each is ~10 ms of mostly startup); raises on any failure."""
    procs = [(cmd, subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)) for cmd in cmds]
    errors = []
    for cmd, proc in procs:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = "timed out after 30 s\n" + err
        if proc.returncode != 0:
            errors.append("%s: exit %s: %s" % (" ".join(cmd), proc.returncode, err.strip()))
    if errors:
        raise RuntimeError("\n".join(errors))


def make_pki(directory: str) -> dict[str, str]:
    """Writes the certificates and keys into directory; returns {"ca": path, "ca_key": path, ...}."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, *_ in CAS + LEAVES:
        paths[name] = os.path.join(directory, name + ".pem")
        paths[name + "_key"] = os.path.join(directory, name + ".key")

    # Valid from a day back, so clock skew between test hosts cannot matter.
    now = datetime.datetime.now(datetime.timezone.utc)
    fmt = "%Y%m%d%H%M%SZ"
    current_dates = tuple((now + datetime.timedelta(days=d)).strftime(fmt) for d in (-1, 30))

    work = tempfile.mkdtemp(prefix=".pki-work-", dir=directory)
    try:
        conf = os.path.join(work, "openssl.cnf")
        text = ["[req]\ndistinguished_name = req_dn\n[req_dn]\n",
                "[policy_cn]\ncommonName = supplied\n",
                EXTENSIONS.format(server_san=SERVER_SAN)]
        text += [CLIENT_EXT.format(name=name, san=san) for name, san in CLIENT_SANS.items()]
        for name, *_ in CAS + LEAVES:
            text.append(CA_SECTION.format(name=name, work=work))
            open(os.path.join(work, name + ".index"), "w").close()
        with open(conf, "w") as f:
            f.write("\n".join(text))

        # 1. Keys and requests, all at once.
        csr = {name: os.path.join(work, name + ".csr") for name, *_ in CAS + LEAVES}
        _run_all([["openssl", "req", "-new", "-config", conf, "-newkey", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                   "-noenc", "-keyout", paths[name + "_key"], "-out", csr[name], "-subj", "/CN=" + cn]
                  for name, cn, *_ in CAS + LEAVES])

        # `openssl x509 -req` in 3.0 cannot set notBefore, and `req -x509` cannot backdate; `ca` can do both.
        def sign(name, issuer, ext, dates):
            cmd = ["openssl", "ca", "-batch", "-notext", "-config", conf, "-name", "ca_" + name, "-rand_serial",
                   "-md", "sha256", "-extensions", ext, "-startdate", dates[0], "-enddate", dates[1],
                   "-keyfile", paths[issuer + "_key"], "-in", csr[name], "-out", paths[name]]
            return cmd + (["-selfsign"] if issuer == name else ["-cert", paths[issuer]])

        # 2. The self-signed CAs, then 3. everything they sign.
        _run_all([sign(name, name, "ext_ca", current_dates) for name, _ in CAS])
        _run_all([sign(name, issuer, ext, EXPIRED_DATES if expired else current_dates)
                  for name, _, issuer, ext, expired in LEAVES])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for name in paths:  # req -keyout makes new files 0600, but not files it overwrites
        if name.endswith("_key"):
            os.chmod(paths[name], 0o600)
    return paths


# ---- self-check ----------------------------------------------------------------------------------

def _openssl(*args, stdin_text=None, timeout=20):
    res = subprocess.run(["openssl"] + list(args), input=stdin_text, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=timeout,
                         stdin=None if stdin_text is not None else subprocess.DEVNULL)
    return res.returncode, res.stdout


def _free_port():
    # scripts/ports.py: a reserved port outside the kernel's ephemeral range (a port-0 pick could be
    # taken by a test running beside this one before s_server binds it).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "scripts"))
    import ports
    return ports.free_port("127.0.0.1")


def _wait_for(proc, marker, timeout):
    """Reads proc's stdout until marker shows up; raises if it does not within timeout."""
    seen = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while marker not in seen:
            left = deadline - time.monotonic()
            chunk = os.read(proc.stdout.fileno(), 4096) if left > 0 and sel.select(left) else b""
            if not chunk:
                raise RuntimeError("no %r from openssl: %r" % (marker, seen[-2000:]))
            seen += chunk


def _tls_request(port, pki, client):
    """One HTTP request over mTLS to s_server -www; returns s_client's output."""
    args = ["s_client", "-connect", "127.0.0.1:%d" % port, "-CAfile", pki["ca"],
            "-verify_return_error", "-verify_ip", "127.0.0.1", "-ign_eof"]
    if client:
        args += ["-cert", pki[client], "-key", pki[client + "_key"]]
    # -ign_eof: keep reading after stdin ends, until the server has sent its page and closed.
    return _openssl(*args, stdin_text="GET / HTTP/1.0\r\n\r\n")[1]


def _self_check():
    failures = []

    def check(what, ok, detail=""):
        print("%s %s%s" % ("ok  " if ok else "FAIL", what, "" if ok else ": " + detail.strip()[-600:]))
        if not ok:
            failures.append(what)

    tmp = tempfile.mkdtemp(prefix="tls_pki_check_")
    server = None
    try:
        start = time.perf_counter()
        pki = make_pki(tmp)
        elapsed = time.perf_counter() - start
        check("make_pki wrote %d files in %.3f s" % (len(pki), elapsed), all(os.path.isfile(p) for p in pki.values()))
        modes = {n: os.stat(p).st_mode & 0o777 for n, p in pki.items() if n.endswith("_key")}
        check("keys are mode 0600", set(modes.values()) == {0o600}, str(modes))

        for name, purpose in [("server", "sslserver"), ("server_new", "sslserver"), ("server_wrong_name", "sslserver"),
                              ("client_a", "sslclient"), ("client_b", "sslclient"), ("client_intruder", "sslclient"),
                              ("server", "sslclient")]:
            rc, out = _openssl("verify", "-CAfile", pki["ca"], "-purpose", purpose, pki[name])
            check("%s verifies against ca (purpose %s)" % (name, purpose), rc == 0 and ": OK" in out, out)
        for name in ["server_other_ca", "client_other_ca"]:
            rc, out = _openssl("verify", "-CAfile", pki["ca"], pki[name])
            check("%s fails against ca" % name, rc != 0 and "unable to get local issuer" in out, out)
            rc, out = _openssl("verify", "-CAfile", pki["other_ca"], pki[name])
            check("%s verifies against other_ca" % name, rc == 0, out)
        rc, out = _openssl("verify", "-CAfile", pki["ca"], pki["server_expired"])
        check("server_expired fails: certificate has expired", rc != 0 and "certificate has expired" in out, out)
        rc, out = _openssl("x509", "-noout", "-dates", "-in", pki["server_expired"])
        check("server_expired dates are 2020-01-01..02", "notBefore=Jan  1 00:00:00 2020" in out
              and "notAfter=Jan  2 00:00:00 2020" in out, out)

        for flag, value in [("-verify_ip", "127.0.0.1"), ("-verify_ip", "::1"), ("-verify_ip", "192.0.2.8"),
                            ("-verify_hostname", "localhost")]:
            rc, out = _openssl("verify", "-CAfile", pki["ca"], flag, value, pki["server"])
            check("server names %s" % value, rc == 0, out)
        rc, out = _openssl("verify", "-CAfile", pki["ca"], "-verify_ip", "127.0.0.1", pki["server_wrong_name"])
        check("server_wrong_name does not name 127.0.0.1", rc != 0 and "IP address mismatch" in out, out)

        _, s1 = _openssl("x509", "-noout", "-serial", "-subject", "-in", pki["server"])
        _, s2 = _openssl("x509", "-noout", "-serial", "-subject", "-in", pki["server_new"])
        check("server_new has another serial and CN", s1.split()[0] != s2.split()[0] and "rotated" in s2, s1 + s2)
        _, text = _openssl("x509", "-noout", "-text", "-in", pki["ca"])
        check("ca is a v3 CA with key identifiers", all(s in text for s in [
            "Version: 3", "CA:TRUE", "Certificate Sign, CRL Sign", "Subject Key Identifier",
            "Authority Key Identifier", "CN = ddprun test CA"]), text)
        _, out = _openssl("x509", "-noout", "-startdate", "-enddate", "-in", pki["ca"])
        dates = dict(line.split("=", 1) for line in out.splitlines())
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        days = [round((datetime.datetime.strptime(dates[k], "%b %d %H:%M:%S %Y GMT") - now).total_seconds() / 86400)
                for k in ("notBefore", "notAfter")]
        check("ca is valid from 1 day back to 30 days ahead", days == [-1, 30], out)

        port = _free_port()
        server = subprocess.Popen(["openssl", "s_server", "-accept", "127.0.0.1:%d" % port, "-cert", pki["server"],
                                   "-key", pki["server_key"], "-CAfile", pki["ca"], "-Verify", "1", "-www",
                                   # without it s_server asks for a client certificate but takes any
                                   "-verify_return_error"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _wait_for(server, b"ACCEPT", 10)  # listening
        out = _tls_request(port, pki, "client_a")
        check("mTLS handshake client_a -> server: Verify return code: 0 (ok)", "Verify return code: 0 (ok)" in out, out)
        # s_server -www answers with a page that shows the client certificate it accepted.
        check("server accepted client_a's certificate", "HTTP/1.0 200" in out and "Subject: CN=node-a" in out, out)
        out = _tls_request(port, pki, "client_other_ca")
        check("server rejects client_other_ca (unknown ca)", "HTTP/1.0 200" not in out
              and "alert unknown ca" in out, out)
        out = _tls_request(port, pki, None)
        check("server rejects a client without a certificate", "HTTP/1.0 200" not in out
              and "alert certificate required" in out, out)
    except Exception as e:  # report, then exit non-zero below
        check("self-check ran to the end", False, "%s: %s" % (type(e).__name__, e))
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
            server.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_self_check())
