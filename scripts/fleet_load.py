#!/usr/bin/env python3
"""The fleet test's driver (scripts/fleet-test.sh): 3 `ork serve` replicas behind HAProxy
(packaging/haproxy/ork.cfg) on loopback, driven by the official `openai` client.

Phases, each 32 concurrent conversations of 3 streamed turns (X-Session-Id per conversation):
1. steady: every request succeeds and ends with [DONE]; >= 95 % of turns 2 and 3 report
   cached_tokens > 0 (affinity); the replicas' /metrics (completed) sum to the client's count;
2. rolling restart during the load (SIGTERM, wait for exit, start, wait ready, next): 0 failed;
3. SIGKILL of one replica during the load: a request fails only if it was streaming on it,
   each failure is a cut stream or a 5xx within the timeout, never a hang.
Usage: fleet_load.py ORK_BINARY MODEL HAPROXY_CFG WORKDIR
"""
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import openai

CONVERSATIONS, TURNS, MAX_TOKENS = 32, 3, 6
TIMEOUT = 120.0
BASE_PORT = 18480
MODEL_ID = [""]  # the served model id, read from /v1/models


def fail(msg):
    sys.exit(f"fleet-test: FAIL: {msg}")


def status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""


class Replica:
    def __init__(self, n, ork, model, work):
        self.n, self.port = n, BASE_PORT + n
        self.args = [ork, "serve", "--model", model, "--pack", f"{work}/model.orkpack",
                     "--budget-mb", "256", "--host", "127.0.0.1", "--port", str(self.port),
                     "--max-seqs", "8", "--queue", "64", "--threads", "1", "--drain-secs", "60",
                     "--prefix-cache-dir", f"{work}/prefix{n}"]
        self.log = open(f"{work}/replica{n}.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=self.log)

    async def ready(self):
        t = time.monotonic()
        while status(f"http://127.0.0.1:{self.port}/health/ready")[0] != 200:
            if self.proc.poll() is not None:
                fail(f"replica {self.n} exited {self.proc.returncode} (see its log)")
            if time.monotonic() - t > 300:
                fail(f"replica {self.n} not ready after 300 s")
            await asyncio.sleep(0.2)

    def completed(self):
        _, text = status(f"http://127.0.0.1:{self.port}/metrics")
        m = re.search(r'^ork_requests_total\{outcome="completed"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else fail(f"no completed count on replica {self.n}")


async def turn(client, conv, history):
    """One streamed turn: (outcome, cached_tokens); outcome 'ok', 'cut' or 'error:…'."""
    history.append({"role": "user", "content": f"Conversation {conv}: name a colour."})
    text, cached, last = "", None, None
    try:
        async with client.chat.completions.with_streaming_response.create(
            model=MODEL_ID[0], messages=history, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-Id": f"conversation-{conv}"},
        ) as resp:
            async for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                last = line[6:]
                if last == "[DONE]":
                    break
                chunk = openai.types.chat.ChatCompletionChunk.model_validate_json(last)
                for c in chunk.choices:
                    text += c.delta.content or ""
                if chunk.usage and chunk.usage.prompt_tokens_details:
                    cached = chunk.usage.prompt_tokens_details.cached_tokens
    except openai.APIStatusError as e:
        return f"error:{e.status_code}", None
    except (openai.APIConnectionError, openai.APITimeoutError) as e:
        return f"error:{type(e).__name__}", None
    except Exception as e:  # a cut chunked body surfaces as httpx's RemoteProtocolError
        return f"cut:{type(e).__name__}", None
    if last != "[DONE]":
        return "cut", None
    history.append({"role": "assistant", "content": text})
    return "ok", cached


async def conversation(client, conv, results):
    history = []
    for t in range(TURNS):
        outcome, cached = await turn(client, conv, history)
        results.append((conv, t, outcome, cached, time.monotonic()))
        if outcome != "ok":
            return


async def load(client):
    results = []
    await asyncio.gather(*(conversation(client, c, results) for c in range(CONVERSATIONS)))
    return results


async def rolling(replicas):
    await asyncio.sleep(1.0)
    for r in replicas:
        r.proc.send_signal(signal.SIGTERM)
        while r.proc.poll() is None:
            await asyncio.sleep(0.1)
        if r.proc.returncode != 0:
            fail(f"replica {r.n} exited {r.proc.returncode} after SIGTERM")
        r.start()
        await r.ready()
        await asyncio.sleep(2.5)  # HAProxy's `rise 2` at `inter 1s`


async def main():
    ork, model, cfg, work = sys.argv[1:5]
    replicas = [Replica(n, ork, model, work) for n in (1, 2, 3)]
    replicas[0].start()
    await replicas[0].ready()  # builds the .orkpack the others read
    for r in replicas[1:]:
        r.start()
    for r in replicas[1:]:
        await r.ready()
    MODEL_ID[0] = re.search(r'"id":"([^"]+)"', status(f"http://127.0.0.1:{replicas[0].port}/v1/models")[1]).group(1)
    env = dict(os.environ, ORK_FLEET_BIND=f"127.0.0.1:{BASE_PORT}",
               **{f"ORK_REPLICA_{r.n}": f"127.0.0.1:{r.port}" for r in replicas})
    haproxy = subprocess.Popen(["haproxy", "-db", "-f", cfg], env=env,
                               stdout=open(f"{work}/haproxy.log", "ab"), stderr=subprocess.STDOUT)
    try:
        await asyncio.sleep(2.5)
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{BASE_PORT}/v1", api_key="none",
                                    timeout=TIMEOUT, max_retries=0)
        t0 = time.monotonic()
        before = sum(r.completed() for r in replicas)
        res = await load(client)
        bad = [x for x in res if x[2] != "ok"]
        if bad:
            fail(f"steady: {len(bad)} failed: {bad[:5]}")
        later = [x for x in res if x[1] > 0]
        hits = sum(1 for x in later if x[3])
        if hits < 0.95 * len(later):
            fail(f"affinity: {hits}/{len(later)} later turns cached")
        served = sum(r.completed() for r in replicas) - before
        if served != len(res):
            fail(f"metrics: replicas completed {served}, the client saw {len(res)}")
        print(f"steady: {len(res)} ok, affinity {hits}/{len(later)}, metrics {served:.0f} = "
              f"{len(res)} ({time.monotonic() - t0:.1f} s)")

        t0 = time.monotonic()
        res, _ = await asyncio.gather(load(client), rolling(replicas))
        bad = [x for x in res if x[2] != "ok"]
        if bad or len(res) != CONVERSATIONS * TURNS:
            fail(f"rolling restart: {len(bad)} failed of {len(res)}: {bad[:5]}")
        print(f"rolling restart: {len(res)} ok, 0 failed ({time.monotonic() - t0:.1f} s)")

        t0 = time.monotonic()
        task = asyncio.ensure_future(load(client))
        await asyncio.sleep(1.0)
        victim = replicas[1]
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        res = await asyncio.wait_for(task, TIMEOUT * TURNS + 30)
        bad = [x for x in res if x[2] != "ok"]
        late = [x for x in bad if x[4] - killed > 5.0 or x[4] < killed]
        if late:
            fail(f"SIGKILL: failures not at the kill (not its streams): {late[:5]}")
        print(f"SIGKILL: {len(res) - len(bad)} ok, {len(bad)} failed at the kill "
              f"({sorted({x[2] for x in bad})}), none hung ({time.monotonic() - t0:.1f} s)")
    finally:
        haproxy.terminate()
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in replicas:
            try:
                r.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                r.proc.kill()
        haproxy.wait()


if __name__ == "__main__":
    asyncio.run(main())
