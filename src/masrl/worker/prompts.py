"""Prompt token ids: chat templates, tool specs, raw prompts, and exact continuation of a turn.

A multi-turn agent sends its whole conversation again on every request, its earlier completions
included as text. Re-tokenising that text need not give the ids the model sampled (a sampled
``"hel" + "lo"`` re-tokenises as ``"hello"``), and training on ids the model never produced is
training on something else. So the renderer remembers each call it rendered (a bounded cache):
when a call ``extends`` an earlier one, that is, its messages are the earlier call's messages, the
earlier completion and more, its prompt is the earlier prompt ids, the sampled completion ids as
they were, and then only the new text, tokenised. Where the template's text does not continue the
earlier turn exactly (a template that rewrites history, a completion cut by a stop string the
template would render otherwise), the whole conversation is tokenised afresh and counted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from masrl.messages import RAW_ROLE


@dataclass
class Turn:
    text: str  # the rendered prompt text
    prompt_ids: list[int]
    completion_ids: list[int]


class PromptRenderer:
    def __init__(self, tokenizer, keep: int = 8192):
        self.tok = tokenizer
        self.turns: OrderedDict[str, Turn] = OrderedDict()
        self.pending: dict[str, str] = {}  # call id -> its prompt text, until its completion is known
        self.keep = keep
        self.stats = {"continued": 0, "retokenized": 0}

    def text(self, messages: list[dict], template_kwargs: dict | None, tools: list[dict] | None,
             generation_prompt: bool = True) -> str:
        """The template's text. With ``tools``: through the template's own ``tools=`` where it has
        one, else in masrl's tag format (``tools.calls``)."""
        kwargs = dict(template_kwargs or {})
        if tools or any(m.get("role") == "tool" for m in messages):
            from masrl.tools.calls import template_renders_tools, with_tools_in_text

            if template_renders_tools(self.tok):
                if tools:
                    kwargs["tools"] = tools
            else:
                messages = with_tools_in_text(messages, tools or [])
        return self.tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)

    def render(self, messages: list[dict], template_kwargs: dict | None = None, tools: list[dict] | None = None,
               extends: str | None = None) -> tuple[str, list[int]]:
        """``(text, prompt ids)``; ``extends``: the call whose conversation these messages continue."""
        if len(messages) == 1 and messages[0].get("role") == RAW_ROLE:  # a raw prompt (no chat template)
            return messages[0]["content"], self._ids(messages[0]["content"])
        text = self.text(messages, template_kwargs, tools)
        turn = self.turns.get(extends) if extends else None
        if turn is not None:
            ids = self._continue(turn, text)
            if ids is not None:
                self.stats["continued"] += 1
                return text, ids
            self.stats["retokenized"] += 1
        return text, self._ids(text)

    def _continue(self, turn: Turn, text: str) -> list[int] | None:
        """The earlier prompt and sampled ids, then the new text; None where ``text`` does not begin
        with the earlier prompt and completion."""
        head = turn.prompt_ids + turn.completion_ids
        for covered in (self.tok.decode(turn.completion_ids, skip_special_tokens=False),
                        self.tok.decode(turn.completion_ids, skip_special_tokens=True)):
            if text.startswith(turn.text + covered):
                return head + self._ids(text[len(turn.text) + len(covered):])
        return None

    def remember(self, call_id: str, prompt_ids: list[int], completion_ids: list[int], text: str | None = None) -> None:
        """Keep a finished call's turn; its prompt text is the one ``render`` was given for it."""
        text = self.pending.pop(call_id) if text is None else text
        self.turns[call_id] = Turn(text, list(prompt_ids), list(completion_ids))
        while len(self.turns) > self.keep:
            self.turns.popitem(last=False)

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []
