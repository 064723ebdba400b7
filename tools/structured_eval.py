#!/usr/bin/env python3
"""Structured outputs as a user meets them: a set of JSON schemas and prompts
(crates/sluice-cli/tests/data/structured_eval.json) sent through the official
`openai` client to any OpenAI-compatible server (`sluice serve`,
`llama-server`, vLLM) with `response_format` json_schema and `strict: true`,
sampled (temperature 0.7, 200 tokens, seeds 0, 1, 2), and each answer checked:
it parses as JSON, it validates against its schema read with OpenAI's strict
semantics (an object without `additionalProperties` allows no other keys),
and it ended by itself (`finish_reason` "stop").

Usage:
    python tools/structured_eval.py --base-url http://127.0.0.1:8000/v1 \\
        [--model NAME] [--set FILE] [--seeds 0,1,2] [--concurrency 8] \\
        [--out results.json]

Prints one line per request and a summary; `--out` writes every answer.
Needs `openai` and `jsonschema`.
"""

import argparse
import concurrent.futures
import copy
import json
import os
import sys

import jsonschema
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SET = os.path.join(HERE, "..", "crates", "sluice-cli", "tests", "data", "structured_eval.json")


def strict(schema):
    """The schema as OpenAI's strict mode reads it: every object schema that
    says nothing of `additionalProperties` allows no keys beyond its
    `properties`."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                node.setdefault("additionalProperties", False)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


def judge(schema, text, finish):
    """(parsed, valid, ended, error) of one answer."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as e:
        return False, False, finish == "stop", f"not JSON: {e}"
    validator = jsonschema.Draft202012Validator(
        strict(schema), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = [e.message for e in validator.iter_errors(value)]
    return True, not errors, finish == "stop", "; ".join(errors[:2]) or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", help="model name (default: the server's first)")
    ap.add_argument("--set", default=DEFAULT_SET)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--min-valid", type=float, help="exit 1 if the valid share is below this")
    ap.add_argument("--out")
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"))
    model = args.model or client.models.list().data[0].id
    with open(args.set, encoding="utf-8") as f:
        cases = json.load(f)
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [
        (case, p, prompt, seed)
        for case in cases
        for p, prompt in enumerate(case["prompts"])
        for seed in seeds
    ]

    def run(job):
        case, p, prompt, seed = job
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True},
            },
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            seed=seed,
        )
        choice = r.choices[0]
        text = choice.message.content or ""
        parsed, valid, ended, error = judge(case["schema"], text, choice.finish_reason)
        return {
            "schema": case["name"],
            "prompt": p,
            "seed": seed,
            "text": text,
            "finish_reason": choice.finish_reason,
            "completion_tokens": r.usage.completion_tokens if r.usage else None,
            "parsed": parsed,
            "valid": valid,
            "ended": ended,
            "error": error,
        }

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(run, jobs))
    for r in results:
        mark = "valid" if r["valid"] else ("parsed" if r["parsed"] else "broken")
        print(
            f"{r['schema']:10s} prompt {r['prompt']} seed {r['seed']}: {mark:6s} "
            f"{r['finish_reason']:6s} {r['completion_tokens']} tokens"
            + (f"  ({r['error']})" if r["error"] else "")
        )
    n = len(results)
    valid = sum(r["valid"] for r in results)
    parsed = sum(r["parsed"] for r in results)
    ended = sum(r["ended"] for r in results)
    summary = {"requests": n, "valid": valid, "parsed": parsed, "ended": ended, "model": model}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "results": results}, f, indent=1)
    if args.min_valid is not None and valid < args.min_valid * n:
        print(f"valid share {valid / n:.3f} is below {args.min_valid}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
