"""Compatibility check with the official `openai` Python client.

Run by tests/openai_client.rs against a sluice server whose scripted model
writes "The quick brown fox jumps over the lazy dog. " one byte at a time.

    python openai_client.py http://127.0.0.1:PORT/v1 MODEL_NAME
"""

import sys

import openai
from openai import OpenAI


def main(base_url: str, model: str) -> None:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    models = client.models.list()
    assert [m.id for m in models.data] == [model], models

    # Completions, not streamed.
    c = client.completions.create(model=model, prompt="Hi", max_tokens=9)
    assert c.choices[0].text == "The quick", c
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.prompt_tokens == 2 and c.usage.completion_tokens == 9, c.usage
    assert c.usage.total_tokens == 11, c.usage

    # n > 1 and stop strings.
    c = client.completions.create(model=model, prompt="Hi", max_tokens=30, n=2, stop=["fox"])
    assert [ch.text for ch in c.choices] == ["The quick brown "] * 2, c
    assert {ch.finish_reason for ch in c.choices} == {"stop"}, c

    # Completions, streamed, with usage in the last chunk.
    text, usage = "", None
    for chunk in client.completions.create(
        model=model, prompt="Hi", max_tokens=15, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == "The quick brown", text
    assert usage is not None and usage.completion_tokens == 15, usage

    # Chat, not streamed.
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello!"},
    ]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=5, logprobs=True, top_logprobs=2)
    assert r.choices[0].message.role == "assistant", r
    assert r.choices[0].message.content == "The q", r
    assert len(r.choices[0].logprobs.content) == 5, r
    assert r.usage.completion_tokens == 5, r.usage

    # Chat, streamed.
    content, finish, usage = "", None, None
    for chunk in client.chat.completions.create(
        model=model,
        messages=messages,
        max_completion_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            finish = ch.finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert content == "The quick", content
    assert finish == "length", finish
    assert usage is not None and usage.completion_tokens == 9, usage

    # Errors surface as the client's typed exceptions.
    try:
        client.completions.create(model=model, prompt="Hi", max_tokens=-1)
    except openai.BadRequestError as e:
        assert e.status_code == 400, e
    else:
        raise AssertionError("max_tokens=-1 was accepted")
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
    except openai.NotFoundError as e:
        # vLLM's answer too: 404, so the client raises NotFoundError.
        assert e.status_code == 404, e
    else:
        raise AssertionError("an unknown model was accepted")

    print("openai client: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
