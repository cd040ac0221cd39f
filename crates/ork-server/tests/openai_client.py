"""The official `openai` client against a running `ork serve` (driven by tests/server/python.rs).

Usage: python3 openai_client.py BASE_URL MODEL_ID API_KEY
Checks chat, streaming chat, completions and log probabilities; streamed text must equal the
non-streamed text (greedy, same seed). Exits non-zero with a message on the first failure.
"""
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


models = [m.id for m in client.models.list()]
check(models == [model], f"models.list() = {models}")

messages = [{"role": "user", "content": "What is the capital of France?"}]
chat = client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, seed=1
)
text = chat.choices[0].message.content
check(chat.object == "chat.completion", f"object {chat.object}")
check(chat.choices[0].message.role == "assistant", "role")
check(len(text) > 0, "empty chat answer")
check(chat.choices[0].finish_reason in ("stop", "length"), "finish_reason")
u = chat.usage
check(u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")

streamed = []
finish = None
usage = None
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=12, temperature=0, seed=1, stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            streamed.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(streamed) == text, f"streamed chat {''.join(streamed)!r} != {text!r}")
check(finish == chat.choices[0].finish_reason, f"stream finish {finish}")
check(usage is not None and usage.completion_tokens == u.completion_tokens
      and usage.prompt_tokens == u.prompt_tokens, f"stream usage {usage} vs {u}")

comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=10, temperature=0)
ctext = comp.choices[0].text
check(comp.object == "text_completion" and len(ctext) > 0, "completion")
check(comp.usage.total_tokens == comp.usage.prompt_tokens + comp.usage.completion_tokens, "completion usage")
parts = []
for chunk in client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=10, temperature=0, stream=True
):
    for c in chunk.choices:
        parts.append(c.text)
check("".join(parts) == ctext, f"streamed completion {''.join(parts)!r} != {ctext!r}")

try:
    client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=2)
    check(False, "unknown model accepted")
except openai.NotFoundError:
    pass
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=2)
    check(False, "empty messages accepted")
except openai.BadRequestError:
    pass
# Log probabilities: one entry per generated token, the greedy token first among its top ones,
# the same streamed and not.
lp = client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens, f"{len(content)} logprobs for {lp.usage}")
for t in content:
    check(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
          and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6 and t.logprob <= 0,
          f"greedy token {t}")
check("".join(t.token for t in content) == lp.choices[0].message.content, "logprob tokens spell the answer")
streamed_lp = []
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
    stream=True,
):
    for c in chunk.choices:
        if c.logprobs and c.logprobs.content:
            streamed_lp.extend(c.logprobs.content)
check([(t.token, t.logprob) for t in streamed_lp] == [(t.token, t.logprob) for t in content],
      "streamed logprobs differ")
clp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=6,
                                temperature=0, logprobs=2)
check(len(clp.choices[0].logprobs.tokens) == clp.usage.completion_tokens
      and all(len(d) <= 2 for d in clp.choices[0].logprobs.top_logprobs), f"completion logprobs {clp}")
try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=2, logprobs=True,
                                   top_logprobs=21)
    check(False, "top_logprobs 21 accepted")
except openai.BadRequestError as e:
    check("top_logprobs" in str(e), f"the refusal names top_logprobs: {e}")
bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    check(False, "wrong key accepted")
except openai.AuthenticationError:
    pass
print(f"ok: chat {text!r}, completion {ctext!r}")
