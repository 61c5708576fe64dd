"""The reference machine's echo check: answers that only repeat the instructions."""

from __future__ import annotations

import pytest

from machines.moderation import Verdict, echoes_prompt


@pytest.mark.parametrize(("summary", "categories"), [
    ("one sentence", []),                      # Gemma 3 270M, constrained
    ("one sentence,", []),                     # SmolLM2-135M: the trailing comma slipped past
    ("One Sentence.", []),
    ("  one   sentence  ", []),
    ("fine", ["short strings"]),
    ("fine", ["Short strings."]),
    ("fine", ["short  strings"]),
    ("content moderator", []),
    ("JSON verdict", []),
    ("approve reject review", []),
])
def test_echoes_are_caught_whatever_their_case_punctuation_or_spacing(summary, categories):
    verdict = Verdict(decision="approve", categories=categories, summary=summary)
    assert echoes_prompt(verdict)


@pytest.mark.parametrize(("summary", "categories"), [
    ("A permissive software license granting broad rights.", ["license"]),
    ("The Apache License 2.0 text.", ["legal", "software license"]),
    ("fine", []),                              # one word is never an echo
    ("sentence", ["strings"]),
    ("The user text is a license.", []),       # words of the prompt, not a phrase of it
])
def test_real_verdicts_are_not_echoes(summary, categories):
    verdict = Verdict(decision="approve", categories=categories, summary=summary)
    assert not echoes_prompt(verdict)
