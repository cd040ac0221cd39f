"""The official `openai` client reading tool calls from `ork serve` (driven by tests/server/tools.rs).

Usage: python3 openai_tools.py BASE_URL MODEL_ID API_KEY
The server's replies are scripted (a text, then a call of get_weather for Paris): checks the
parsed call, whole and assembled from streamed deltas, and a second turn that sends the call and
its result back. Exits non-zero with a message on the first failure.
"""
import json
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)


tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string"}},
                   "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]

r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=200,
                                   temperature=0)
msg = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls", f"finish_reason {r.choices[0].finish_reason}")
check(msg.content == "Let me look that up.", f"content {msg.content!r}")
check(msg.tool_calls is not None and len(msg.tool_calls) == 1, f"tool_calls {msg.tool_calls}")
call = msg.tool_calls[0]
check(call.type == "function" and call.function.name == "get_weather", f"call {call}")
check(json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}, f"args {call}")

# Streamed: OpenAI's delta shape (index, id and name first, then argument chunks).
content, calls, finish = [], {}, None
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools,
                                            max_tokens=200, temperature=0, stream=True):
    for c in chunk.choices:
        if c.delta.content:
            content.append(c.delta.content)
        for d in c.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                entry["id"] = d.id
            if d.function and d.function.name:
                entry["name"] += d.function.name
            if d.function and d.function.arguments:
                entry["arguments"] += d.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
check("".join(content) == msg.content, f"streamed content {''.join(content)!r}")
check(finish == "tool_calls", f"streamed finish {finish}")
check(list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
      and json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments),
      f"streamed calls {calls}")

# The next turn: the call and its result go back through the template.
turn = messages + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21}"},
]
r2 = client.chat.completions.create(model=model, messages=turn, tools=tools, max_tokens=200,
                                    temperature=0)
check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 20, f"second turn usage {r2.usage}")
check(r2.choices[0].message.tool_calls is not None, "second turn parsed")

# A named function: the reply is started as its call (the scripted reply then follows, so the
# output is no longer a well-formed call: it comes back as content, not as an error).
r3 = client.chat.completions.create(
    model=model, messages=messages, tools=tools, max_tokens=200, temperature=0,
    tool_choice={"type": "function", "function": {"name": "get_weather"}})
check(r3.choices[0].message.tool_calls is None and r3.choices[0].finish_reason == "stop"
      and "get_weather" in r3.choices[0].message.content, f"named choice {r3}")
try:
    client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=2,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    check(False, "unknown tool_choice function accepted")
except openai.BadRequestError as e:
    check("tool_choice" in str(e), f"the refusal names tool_choice: {e}")
print(f"ok: {call.function.name}({call.function.arguments})")
