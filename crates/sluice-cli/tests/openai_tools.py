"""Tool calling through the official `openai` Python client, on the real
SmolLM2 model served with `--enable-auto-tool-choice --tool-call-parser
hermes`.

Run by tests/structured.rs (`tool_calls_through_the_official_openai_client`):

    python openai_tools.py http://127.0.0.1:PORT/v1 MODEL_NAME

Checks, for `tool_choice: "required"` and a named function, streamed and
not: each call's arguments parse as JSON and satisfy the tool's parameters
(required keys, types, enums: checked by hand, the venv has no
`jsonschema`), ids start with "chatcmpl-tool-", finish_reason is
"tool_calls" for required and "stop" for named (vLLM's rule), and the
streamed deltas reassemble to well-formed calls. `tool_choice: "auto"`: only
that the request succeeds and the response is well-formed (a 135M model
may or may not call a tool).
"""

import json
import sys

from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {
                "timezone": {"type": "string", "maxLength": 30},
                "hour24": {"type": "boolean"},
                "offset": {"type": "integer", "minimum": -12, "maximum": 14},
            },
            "required": ["timezone", "hour24"],
            "additionalProperties": False,
        },
    },
}

TOOLS = [WEATHER, TIME]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]

TYPES = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def check_args(name: str, arguments: str) -> dict:
    """The arguments parse as JSON and satisfy the tool's parameters."""
    assert name in BY_NAME, name
    schema = BY_NAME[name]
    args = json.loads(arguments)
    assert isinstance(args, dict), (name, arguments)
    for key in schema["required"]:
        assert key in args, (name, key, arguments)
    props = schema["properties"]
    for key, value in args.items():
        assert key in props, (name, "unexpected key", key, arguments)
        p = props[key]
        assert TYPES[p["type"]](value), (name, key, value, arguments)
        if "enum" in p:
            assert value in p["enum"], (name, key, value, arguments)
        if "maxLength" in p:
            assert len(value) <= p["maxLength"], (name, key, value)
        if "minimum" in p:
            assert p["minimum"] <= value <= p["maximum"], (name, key, value)
    return args


def check_calls(calls, expect_name=None):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function", c
        assert c.id.startswith("chatcmpl-tool-"), c.id
        if expect_name is not None:
            assert c.function.name == expect_name, c
        check_args(c.function.name, c.function.arguments)
    ids = [c.id for c in calls]
    assert len(set(ids)) == len(ids), ids


def stream_calls(client, model, validate=True, **kw):
    """Streams a chat completion; reassembles delta.tool_calls by index.
    Returns ([(id, name, arguments)], content, finish_reason)."""
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        for ch in chunk.choices:
            d = ch.delta
            if d.content:
                content += d.content
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id is not None:
                    assert entry["id"] is None, ("id sent twice", tc)
                    entry["id"] = tc.id
                if tc.function is not None:
                    if tc.function.name is not None:
                        assert entry["name"] is None, ("name sent twice", tc)
                        entry["name"] = tc.function.name
                    if tc.function.arguments:
                        entry["arguments"] += tc.function.arguments
            if ch.finish_reason is not None:
                finish = ch.finish_reason
    assert sorted(calls) == list(range(len(calls))), calls
    out = []
    for i in sorted(calls):
        e = calls[i]
        assert e["id"] is not None and e["id"].startswith("chatcmpl-tool-"), e
        assert e["name"] is not None, e
        if validate:
            check_args(e["name"], e["arguments"])
        out.append((e["id"], e["name"], e["arguments"]))
    return out, content, finish


def main(base_url: str, model: str) -> None:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    common = dict(messages=MESSAGES, tools=TOOLS, max_tokens=300, temperature=0)

    # Required, one call and any number of calls.
    for parallel in (False, True):
        r = client.chat.completions.create(
            model=model, tool_choice="required", parallel_tool_calls=parallel, **common
        )
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", r
        check_calls(ch.message.tool_calls)
        if not parallel:
            assert len(ch.message.tool_calls) == 1, ch.message.tool_calls
        # Streamed: the same calls (greedy), argument texts equal as JSON.
        calls, _, finish = stream_calls(
            client, model, tool_choice="required", parallel_tool_calls=parallel, **common
        )
        assert finish == "tool_calls", finish
        assert [(n, json.loads(a)) for _, n, a in calls] == [
            (c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls
        ], (calls, ch.message.tool_calls)

    # Named, each tool: one call of that tool, finish_reason "stop".
    for tool in TOOLS:
        name = tool["function"]["name"]
        choice = {"type": "function", "function": {"name": name}}
        r = client.chat.completions.create(model=model, tool_choice=choice, **common)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", r
        check_calls(ch.message.tool_calls, expect_name=name)
        assert len(ch.message.tool_calls) == 1, ch.message.tool_calls
        calls, _, finish = stream_calls(client, model, tool_choice=choice, **common)
        assert finish == "stop", finish
        assert len(calls) == 1 and calls[0][1] == name, calls
        assert json.loads(calls[0][2]) == json.loads(ch.message.tool_calls[0].function.arguments)

    # Auto with the hermes parser: well-formed whatever the model does.
    r = client.chat.completions.create(model=model, tool_choice="auto", **common)
    ch = r.choices[0]
    assert ch.message.role == "assistant", r
    assert ch.finish_reason in ("stop", "length", "tool_calls"), r
    if ch.message.tool_calls:
        # The model chose the call, so only its form is checked.
        assert ch.finish_reason == "tool_calls", r
        for c in ch.message.tool_calls:
            assert c.id.startswith("chatcmpl-tool-"), c
            assert isinstance(c.function.name, str), c
            json.loads(c.function.arguments)
    else:
        assert ch.message.content is not None, r
    calls, content, finish = stream_calls(
        client, model, validate=False, tool_choice="auto", **common
    )
    assert finish in ("stop", "length", "tool_calls"), finish
    assert calls or content, "an empty streamed answer"

    print("openai tool-call checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
