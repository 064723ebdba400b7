"""Compatibility check with the official `anthropic` Python client.

Run by tests/anthropic.rs against two sluice servers on the scripted
model: PLAIN_URL writes "The quick brown fox jumps over the lazy dog. "
one byte at a time and wants the API key `sk-local`; TOOL_URL (qwen3
reasoning parser, hermes tool parser) writes one thinking span and one
tool call, then stops.

    python anthropic_client.py PLAIN_URL TOOL_URL MODEL_NAME
"""

import sys

import anthropic
from anthropic import Anthropic

USER = [{"role": "user", "content": "Hello!"}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather of a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def plain(url: str, model: str) -> None:
    c = Anthropic(base_url=url, api_key="sk-local", max_retries=0)

    m = c.messages.create(model=model, max_tokens=9, messages=USER)
    assert m.type == "message" and m.role == "assistant", m
    assert [b.type for b in m.content] == ["text"], m
    assert m.content[0].text == "The quick", m
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None, m
    assert m.usage.output_tokens == 9, m.usage

    # With a system prompt (string and blocks) and stop sequences.
    for system in ["Be brief.", [{"type": "text", "text": "Be brief."}]]:
        m = c.messages.create(
            model=model, max_tokens=60, system=system, stop_sequences=["lazy", "fox"], messages=USER
        )
        assert m.content[0].text == "The quick brown ", m
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "fox", m

    # Streaming with the client's helpers.
    with c.messages.stream(model=model, max_tokens=15, messages=USER) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "The quick brown", text
    assert final.content[0].text == text, final
    assert final.stop_reason == "max_tokens", final
    assert final.usage.output_tokens == 15, final.usage

    # The raw events, in Anthropic's order.
    with c.messages.stream(model=model, max_tokens=3, messages=USER) as s:
        kinds = [e.type for e in s]
    raw = [k for k in kinds if k not in ("text",)]
    assert raw[0] == "message_start", kinds
    assert raw[1:3] == ["content_block_start", "content_block_delta"], kinds
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds

    # count_tokens: the prompt the same message runs on.
    n = c.messages.count_tokens(model=model, system="Be brief.", messages=USER)
    m = c.messages.create(model=model, max_tokens=1, system="Be brief.", messages=USER)
    used = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert n.input_tokens == used and used > 0, (n, m.usage)

    # Errors, as the client's exception types.
    omit = getattr(anthropic, "omit", anthropic.NOT_GIVEN)
    try:
        # An explicit timeout: the client derives its default from max_tokens.
        c.messages.create(model=model, max_tokens=omit, messages=USER, timeout=30)
        raise AssertionError("a message without max_tokens was accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400, e
        assert e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert "max_tokens" in e.body["error"]["message"], e.body
    try:
        c.messages.create(model="claude-elsewhere", max_tokens=5, messages=USER)
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    try:
        Anthropic(base_url=url, api_key="sk-wrong", max_retries=0).messages.create(
            model=model, max_tokens=5, messages=USER
        )
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body


def tools(url: str, model: str) -> None:
    c = Anthropic(base_url=url, api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model=model, max_tokens=200, tools=TOOLS, messages=ask)
    assert [b.type for b in m.content] == ["thinking", "tool_use"], m
    assert m.content[0].thinking == "I should look it up.", m
    call = m.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}, call
    assert m.stop_reason == "tool_use", m

    # The follow-up: the assistant's blocks echoed back, then the result.
    follow = ask + [
        {"role": "assistant", "content": m.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21 C, sunny"}],
        },
    ]
    m2 = c.messages.create(model=model, max_tokens=200, tools=TOOLS, messages=follow)
    assert m2.stop_reason == "tool_use", m2

    # Streamed: thinking and the call's input rebuilt by the client.
    with c.messages.stream(model=model, max_tokens=200, tools=TOOLS, messages=ask) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"], final
    assert final.content[0].thinking == "I should look it up.", final
    assert final.content[1].input == {"city": "Paris"}, final
    assert final.stop_reason == "tool_use", final

    # Counting with tools renders what the message would (this scripted
    # model's template does not show tools, so the counts agree).
    n = c.messages.count_tokens(model=model, tools=TOOLS, messages=ask)
    m = c.messages.create(model=model, max_tokens=1, tools=TOOLS, messages=ask)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), (n, m)


if __name__ == "__main__":
    plain(sys.argv[1], sys.argv[3])
    tools(sys.argv[2], sys.argv[3])
    print("anthropic client: all checks passed")
