#!/usr/bin/env python3
"""load_test.py: a bounded streaming load test of an fp4serve server on loopback, standard
library only (for machines without node, such as the GPU machine).

  python3 bench/load_test.py --port 8000 --clients 64 --seconds 60 [--prompt-tokens 512]
                             [--max-tokens 256] [--api-key KEY] [--model NAME]
                             [--temperature 0] [--top-p 1] [--logprobs N [--logprobs-clients C]]

CLIENTS threads each send streaming /v1/completions requests back to back until SECONDS have
passed (a request in flight at the deadline finishes). Prints errors, requests, aggregate output
tok/s (completion tokens from the final usage chunk / wall time), and p50/p99 time to first
token and inter-token latency. --logprobs N: the first C clients (all by default) ask for each
token's logprob and N alternatives (completions' `logprobs`). Exit status 1 on any error. Only 127.0.0.1 is ever contacted.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time


def one_request(port, body, headers, out):
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        out["errors"].append(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        conn.close()
        return
    first, last, gaps, tokens, done = None, None, [], 0, False
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                done = True
                continue
            msg = json.loads(data)
            if "error" in msg:
                out["errors"].append(str(msg["error"])[:200])
                continue
            now = time.perf_counter()
            if msg.get("choices") and msg["choices"][0].get("text"):
                if first is None:
                    first = now
                elif last is not None:
                    gaps.append(now - last)
                last = now
            if msg.get("usage"):
                tokens = msg["usage"].get("completion_tokens", 0)
    conn.close()
    if not done:
        out["errors"].append("stream ended without [DONE]")
        return
    with out["lock"]:
        out["requests"] += 1
        out["tokens"] += tokens
        if first is not None:
            out["ttft"].append(first - t0)
        out["itl"].extend(gaps)


def client(port, body, headers, deadline, out):
    while time.perf_counter() < deadline:
        try:
            one_request(port, body, headers, out)
        except Exception as e:  # a dropped connection is an error of the run, not of the script
            out["errors"].append(repr(e)[:200])


def count_tokens(port, text, key):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/tokenize", body=json.dumps({"prompt": text}), headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200:
        return -1
    msg = json.loads(body)
    return msg.get("count", len(msg.get("tokens", [])))


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--temperature", type=float, default=0.0)  # 0: greedy (the runs recorded so far)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--logprobs", type=int, default=None)  # 0..20 alternatives
    ap.add_argument("--logprobs-clients", type=int, default=None)  # how many clients ask (all)
    a = ap.parse_args()
    # a prompt of about N tokens, calibrated with the server's own /tokenize
    words = a.prompt_tokens
    prompt = ""
    for _ in range(4):
        prompt = " ".join(f"w{i % 97}" for i in range(max(1, words)))
        n = count_tokens(a.port, prompt, a.api_key)
        if n <= 0 or abs(n - a.prompt_tokens) <= max(2, a.prompt_tokens // 50):
            break
        words = max(1, int(words * a.prompt_tokens / n))
    req = {"prompt": prompt, "max_tokens": a.max_tokens, "stream": True, "temperature": a.temperature,
           "top_p": a.top_p,
           "ignore_eos": True, "stream_options": {"include_usage": True}}
    if a.model:
        req["model"] = a.model
    headers = {"Content-Type": "application/json"}
    if a.api_key:
        headers["Authorization"] = f"Bearer {a.api_key}"
    out = {"lock": threading.Lock(), "errors": [], "requests": 0, "tokens": 0, "ttft": [], "itl": []}
    t0 = time.perf_counter()
    deadline = t0 + a.seconds
    lp_clients = a.clients if a.logprobs_clients is None else a.logprobs_clients
    lp_req = dict(req, logprobs=a.logprobs) if a.logprobs is not None else req
    threads = [threading.Thread(target=client, args=(a.port, json.dumps(lp_req if i < lp_clients else req), headers,
                                                      deadline, out))
               for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    print(f"clients {a.clients}, {a.seconds:.0f} s ({wall:.1f} s wall with the drain), prompt "
          f"{count_tokens(a.port, prompt, a.api_key)} tokens, {a.max_tokens} new tokens each, temperature "
          f"{a.temperature}, top_p {a.top_p}, logprobs "
          f"{'none' if a.logprobs is None else f'{a.logprobs} in {lp_clients} clients'}")
    print(f"requests {out['requests']}, errors {len(out['errors'])}")
    for e in out["errors"][:5]:
        print("  error:", e)
    print(f"output tokens {out['tokens']}: {out['tokens'] / wall:.1f} tok/s aggregate")
    print(f"time to first token  p50 {pct(out['ttft'], 50) * 1e3:.1f} ms  p99 {pct(out['ttft'], 99) * 1e3:.1f} ms")
    print(f"inter-token latency  p50 {pct(out['itl'], 50) * 1e3:.2f} ms  p99 {pct(out['itl'], 99) * 1e3:.2f} ms")
    sys.exit(1 if out["errors"] else 0)


if __name__ == "__main__":
    main()
