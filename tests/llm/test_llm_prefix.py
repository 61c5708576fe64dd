"""Prefix reuse in the embedded model, read from llama.cpp's own counters (``/fsm/perf``).

The instructions every instance of a state shares are evaluated once per model process:
a second call with the same system prompt evaluates only what follows it, and a re-ask
(the conversation so far + the model's answer + one more user turn) evaluates only the new
turn, also when another call ran in between (the KV state kept in the RAM cache).
"""

from __future__ import annotations

import asyncio

import pytest

from fsm_engine.llm import LocalLlama

try:
    from llm_fixtures import qwen_path  # noqa: F401
except ImportError:
    from tests.helpers.llm_fixtures import qwen_path  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.slow]

SYSTEM = ("You are a content moderator. Read the user's text and answer with ONLY a JSON "
          'object, no prose: {"decision": "approve" | "reject" | "review", '
          '"categories": [short strings], "summary": "one sentence"}. ' * 3)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Text to moderate:\n\n{text}\n\nJSON verdict:"}]


async def _evaluated(provider: LocalLlama, messages: list[dict[str, str]]) -> tuple[int, int]:
    """(prompt tokens llama.cpp evaluated for this call, the call's prompt tokens)."""
    assert provider.server is not None
    before = await provider.server.perf()
    done = await provider.complete(messages, max_tokens=8)
    after = await provider.server.perf()
    decoded = after["n_eval"] - before["n_eval"]  # one-token decodes: generation (+ a tail)
    tail = max(0, decoded - done.completion_tokens)
    return int(after["n_p_eval"] - before["n_p_eval"] + tail), done.prompt_tokens


def test_a_shared_prefix_and_a_reask_are_not_evaluated_again(qwen_path):  # noqa: F811
    provider = LocalLlama(qwen_path)

    async def go() -> list[tuple[int, int]]:
        try:
            await provider.load()
            first = _user("The cat sat on the mat and purred all afternoon.")
            seen = [await _evaluated(provider, first)]
            seen.append(await _evaluated(provider, _user("A recipe for bread: flour, water.")))
            reply = (await provider.complete(first, max_tokens=8)).text  # cached, as the engine
            reask = first + [{"role": "assistant", "content": reply},
                             {"role": "user", "content": "That answer was invalid. Reply "
                                                         "with only the JSON object."}]
            await _evaluated(provider, _user("Something else entirely, in between."))
            seen.append(await _evaluated(provider, reask))
            return seen
        finally:
            await provider.aclose()

    (ev1, p1), (ev2, p2), (ev3, p3) = asyncio.run(go())
    assert ev1 >= p1 - 12, (ev1, p1)  # the first call evaluates (almost) all of its prompt
    assert ev2 < p2 - 100, (ev2, p2)  # the shared instructions (> 100 tokens) are reused
    assert ev3 < p3 - p1 + 8, (ev3, p3, p1)  # a re-ask evaluates only the new turn
