# ttft.py LOG CMD...: wall clock from just before the process is started to the first byte on
# its stdout (run -n 1 writes the token's text, then a newline, as soon as it exists) and to its
# exit; stderr goes to LOG.
import os, subprocess, sys, time
log = open(sys.argv[1], "a")
t0 = time.monotonic()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=log)
first, out = None, b""
while True:
    b = os.read(p.stdout.fileno(), 4096)
    if not b:
        break
    if first is None:
        first = time.monotonic() - t0
    out += b
rc = p.wait()
t1 = time.monotonic() - t0
print("first_token_s %.3f exit_s %.3f rc %d stdout %r" % (first if first is not None else -1, t1, rc, out[:60]), flush=True)
