"""The Responses API through the official `openai` client and the OpenAI
Agents SDK (`openai-agents`).

Run by tests/responses.rs against two sluice servers on the scripted
model: PLAIN_URL writes "The quick brown fox jumps over the lazy dog. "
one byte at a time; AGENT_URL (hermes tool parser, qwen3 reasoning
parser) calls `get_weather` for Paris until the tool's output is in its
prompt, then answers "It is 21 C and sunny in Paris.".

    python openai_responses.py PLAIN_URL AGENT_URL MODEL_NAME
"""

import asyncio
import json
import sys

import openai
from openai import OpenAI

TEXT = "The quick brown fox jumps over the lazy dog. "
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def plain(url: str, model: str) -> None:
    c = OpenAI(base_url=url, api_key="unused", max_retries=0)

    r = c.responses.create(model=model, input="Hi", max_output_tokens=9)
    assert r.object == "response" and r.status == "incomplete", r
    assert r.output_text == TEXT[:9], r
    assert r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 9 and r.usage.total_tokens == r.usage.input_tokens + 9, r.usage

    # With instructions and input items.
    r = c.responses.create(
        model=model,
        instructions="Be brief.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}],
        max_output_tokens=5,
        temperature=0.5,
        top_p=0.9,
    )
    assert r.output_text == TEXT[:5], r
    assert r.instructions == "Be brief." and r.temperature == 0.5, r

    # Stored, retrieved, continued.
    first = c.responses.create(model=model, input="Hi", max_output_tokens=4)
    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text, got
    follow = c.responses.create(model=model, input="More", previous_response_id=first.id, max_output_tokens=4)
    assert follow.previous_response_id == first.id, follow
    try:
        c.responses.create(model=model, input="x", previous_response_id="resp_missing")
        raise AssertionError("a missing previous_response_id was accepted")
    except openai.NotFoundError as e:
        assert "resp_missing" in str(e), e

    # Streaming: the helper folds the typed events into the response.
    with c.responses.stream(model=model, input="Hi", max_output_tokens=12) as s:
        kinds, deltas = [], ""
        for event in s:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = s.get_final_response()
    assert deltas == TEXT[:12], deltas
    assert final.output_text == TEXT[:12], final
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == "response.completed", kinds
    for k in ["response.output_item.added", "response.content_part.added",
              "response.output_text.done", "response.output_item.done"]:
        assert k in kinds, (k, kinds)
    # ... and `stream=True` gives the raw typed events.
    events = list(c.responses.create(model=model, input="Hi", max_output_tokens=3, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    assert events[-1].response.output_text == TEXT[:3], events[-1]

    # Background, then cancelled.
    bg = c.responses.create(model=model, input="Hi", background=True, max_output_tokens=3)
    assert bg.status in ("queued", "in_progress", "completed", "incomplete"), bg

    # Errors as the client's exceptions.
    try:
        c.responses.create(model=model, input="x", max_output_tokens=0)
        raise AssertionError("max_output_tokens 0 was accepted")
    except openai.BadRequestError as e:
        assert e.param == "max_output_tokens", e


def with_tools(url: str, model: str) -> None:
    c = OpenAI(base_url=url, api_key="unused", max_retries=0)
    ask = "What is the weather in Paris?"
    r = c.responses.create(model=model, input=ask, tools=TOOLS)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1, r
    call = calls[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}, call

    # The follow-up with the function's output: the answer.
    r2 = c.responses.create(
        model=model,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C and sunny"}],
        tools=TOOLS,
    )
    assert r2.output_text == "It is 21 C and sunny in Paris.", r2
    # The same without the store: the items handed back.
    r3 = c.responses.create(
        model=model,
        input=[{"role": "user", "content": ask}, *[o.model_dump() for o in r.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "21 C and sunny"}],
        tools=TOOLS,
        store=False,
    )
    assert r3.output_text == r2.output_text, r3

    # text.format json_schema is accepted through the structured path.
    c.responses.create(
        model=model,
        input="x",
        max_output_tokens=4,
        text={"format": {"type": "json_schema", "name": "w", "strict": True,
                         "schema": {"type": "object", "properties": {"a": {"type": "string"}},
                                    "required": ["a"], "additionalProperties": False}}},
    )

    # Streamed: the call's arguments rebuilt by the client.
    with c.responses.stream(model=model, input=ask, tools=TOOLS) as s:
        final = s.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert len(calls) == 1 and json.loads(calls[0].arguments) == {"city": "Paris"}, final


def agent(url: str, model: str) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        seen.append(city)
        return "21 C and sunny"

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    a = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )
    async def both():
        # One event loop for the client's connections.
        result = await Runner.run(a, "What is the weather in Paris?")
        assert seen == ["Paris"], seen
        assert result.final_output == "It is 21 C and sunny in Paris.", result.final_output
        streamed = Runner.run_streamed(a, "What is the weather in Paris?")
        kinds = set()
        async for e in streamed.stream_events():
            kinds.add(e.type)
        assert "raw_response_event" in kinds, kinds
        assert streamed.final_output == "It is 21 C and sunny in Paris.", streamed.final_output
        assert seen == ["Paris", "Paris"], seen

    asyncio.run(both())


if __name__ == "__main__":
    plain(sys.argv[1], sys.argv[3])
    with_tools(sys.argv[2], sys.argv[3])
    agent(sys.argv[2], sys.argv[3])
    print("openai Responses client and Agents SDK: all checks passed")
